"""``datacentric.data.media_decode`` keeps every name it gave before its concerns moved to
modules beside it (each the very object of its new home), lists them in ``__all__``,
and a patch of a name it uses reaches ``probe`` and ``decode``."""

from __future__ import annotations

import importlib

import pytest
from moved_names import assert_given_as_defined

#: each name ``media_decode`` gave before the split that is defined elsewhere now, and
#: where (the names other modules and tests import from it, or patch there)
HOMES = {
    "ANIMATED_FORMATS": "media_images",
    "IMAGE_PLUGINS": "media_images",
    "_image_plugin": "media_images",
    "MediaError": "media_info",
    "MediaInfo": "media_info",
    "COVER_PICTURE": "media_streams",
    "DEFAULT_STREAM": "media_streams",
    "_Frames": "media_streams",
    "_shown_stream": "media_streams",
}
#: every definition that moved, by its new home (the old module used them all)
MOVED = {
    "media_info": ["MediaError", "MediaInfo"],
    "media_images": [
        "IMAGE_PLUGINS",
        "ANIMATED_FORMATS",
        "_image_plugin",
        "_open_image",
        "_unreadable_image",
        "_sixteen_bit",
        "_level_problem",
        "_rgb",
        "_image_orientation",
        "_stored_size",
        "_animation_frames",
        "_probe_image",
        "_pictures",
        "_decode_image",
    ],
    "media_streams": [
        "DEFAULT_STREAM",
        "COVER_PICTURE",
        "_disposition",
        "_shown_stream",
        "_open_video",
        "_Frames",
        "INTERLACED_ORDERS",
        "DEINTERLACER",
        "_pulled",
        "_deinterlaced",
    ],
    "media_display": [
        "_display_matrix",
        "_display_turns",
        "_pixel_aspect",
        "_square_width",
        "_square_pixels",
        "_upright",
        "_picture",
    ],
    "media_frame_counts": ["SLOT_COUNTS", "_demuxed_pictures", "_stated_frames", "_frame_time"],
}
#: the names ``media_decode`` still defines: the entry points and their reading's revision
KEPT = ["READING_REVISION", "decode", "probe"]
PACKAGE = "datacentric.data"


@pytest.mark.parametrize("name", sorted(HOMES))
def test_media_decode_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined(f"{PACKAGE}.media_decode", f"{PACKAGE}.{HOMES[name]}", name)


@pytest.mark.parametrize(("home", "name"), [(h, n) for h, names in MOVED.items() for n in names])
def test_each_moved_definition_lives_in_its_new_home_only(home, name):
    module = importlib.import_module(f"{PACKAGE}.{home}")
    assert name in vars(module)
    if not name.isupper():
        assert getattr(module, name).__module__ == module.__name__
    others = [h for h in MOVED if h != home]
    for other in others:  # defined once: no other home has its own copy
        value = vars(importlib.import_module(f"{PACKAGE}.{other}")).get(name)
        assert value is None or value is getattr(module, name), (other, name)


def test_media_decode_lists_exactly_those_names_and_defines_its_own():
    decode = importlib.import_module(f"{PACKAGE}.media_decode")
    assert sorted(decode.__all__) == sorted([*HOMES, *KEPT])
    for name in KEPT:
        assert name.isupper() or getattr(decode, name).__module__ == decode.__name__


def test_a_patch_of_media_decode_s_frames_reaches_probe_and_decode(tmp_path, monkeypatch):
    """``probe`` and ``decode`` read a clip's frames through ``media_decode._Frames``, as
    the test that counts the frames decoded patches it
    (tests/runtime/data/test_clip_frame_counts.py)."""
    pytest.importorskip("av")
    from media_formats import wave_frames

    from datacentric.data.media_sources import MediaItem

    decode = importlib.import_module(f"{PACKAGE}.media_decode")
    read: list[str] = []

    class Counted(decode._Frames):
        def __iter__(self):
            read.append("frames")
            return super().__iter__()

    monkeypatch.setattr(decode, "_Frames", Counted)
    path = tmp_path / "clip.mkv"
    _write(path, wave_frames(2, 16, 16))
    item = MediaItem(0, path, path.name, "a cat", path.name)
    assert decode.probe(item).frames == len(decode.decode(item)) == 2
    assert read == ["frames", "frames"]


def _write(path, frames) -> None:
    """A lossless FFV1 clip of ``frames`` (RGB arrays)."""
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv444p"
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
