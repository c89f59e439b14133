"""Every kind of clip and image a ``NAME.txt`` folder lists is read: each video suffix in
the container its name says (a phone's 3GP, MPEG program and transport streams, AVCHD's
192-byte-packet M2TS, WMV, FLV, Ogg, MXF ...), written with PyAV and decoded back; TIFF
and AVIF stills; a HEIC photo Pillow cannot open without its plugin is listed and
skipped naming the plugin. What such a folder holds that no sample comes of (a captioned
file of another kind, a caption with nothing beside it) is listed with its reason, and
``prepare`` reports it as skipped; hidden files and uncaptioned non-media are not."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from fractions import Fraction

import numpy as np
import pytest
from media_formats import SUFFIX_FORMATS, wave_frames, write_format_clip

from datacentric.data import media_decode
from datacentric.data.base import DataError
from datacentric.data.media_decode import MediaError, decode, probe
from datacentric.data.media_sources import IMAGE_SUFFIXES, VIDEO_SUFFIXES, read_media_source

#: what a HEIC without pillow-heif is refused naming: the extra, or the plugin itself
HEIF_INSTALL = "plugin: pip install 'datacentric[heif]' (or pip install 'pillow-heif>=0.16')"

pytest.importorskip("av")


def _still(path, seed: int = 0) -> np.ndarray:
    from PIL import Image

    pixels = wave_frames(1, 32, 48, seed)[0]
    Image.fromarray(pixels).save(path)
    return pixels


@pytest.fixture
def no_heif_plugin(monkeypatch):
    """pillow-heif not installed (``import pillow_heif`` fails), whatever this machine has:
    its reader is hidden from Pillow where a test before registered it."""
    from PIL import Image

    monkeypatch.setitem(sys.modules, "pillow_heif", None)
    Image.init()
    monkeypatch.setattr(Image, "ID", [name for name in Image.ID if name != "HEIF"])
    others = {suffix: name for suffix, name in Image.EXTENSION.items() if name != "HEIF"}
    monkeypatch.setattr(Image, "EXTENSION", others)
    media_decode._image_plugin.cache_clear()
    yield
    media_decode._image_plugin.cache_clear()


def test_every_suffix_a_folder_lists_is_read(tmp_path, no_heif_plugin):
    from PIL import features

    assert set(SUFFIX_FORMATS) == set(VIDEO_SUFFIXES)  # a written clip for every suffix
    written = {}
    for number, (suffix, spec) in enumerate(SUFFIX_FORMATS.items()):
        name = f"v{number}{suffix}"
        write_format_clip(tmp_path / name, 9, 32, 48, seed=number, rate=25, spec=spec)
        written[name] = wave_frames(9, 32, 48, number)
    readable = [s for s in IMAGE_SUFFIXES if s not in (".heic", ".heif")]
    readable = [s for s in readable if s not in (".avif", ".avifs") or features.check("avif")]
    for number, suffix in enumerate(readable):
        written[f"i{number}{suffix}"] = [_still(tmp_path / f"i{number}{suffix}", number)]
    (tmp_path / "photo.heic").write_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic")
    for name in [*written, "photo.heic"]:
        (tmp_path / name).with_suffix(".txt").write_text(f"{name}: a cat")

    items = {item.source: item for item in read_media_source(tmp_path)}
    assert set(items) == {*written, "photo.heic"}
    assert all(i.caption == f"{s}: a cat" and i.unread is None for s, i in items.items())
    for name, frames in written.items():
        item = items[name]
        assert item.is_image == (len(frames) == 1), name
        info = probe(item)
        assert (info.frames, info.height, info.width) == (len(frames), 32, 48), name
        got = decode(item)
        assert [f.size for f in got] == [(48, 32)] * len(frames), name
        # lossy codecs at their defaults and GIF's 256 colours: 16.2 levels at most from
        # the waves written (another seed's waves are 79 off, another frame's more); PNG,
        # BMP and TIFF exactly
        error = np.mean([np.abs(np.asarray(g, float) - w) for g, w in zip(got, frames)])
        assert error < 25, (name, error)
        if name.endswith((".png", ".bmp", ".tif", ".tiff")):
            assert np.array_equal(np.asarray(got[0]), frames[0]), name
    assert items["photo.heic"].is_image
    for read in (probe, decode):
        with pytest.raises(MediaError, match=re.escape(HEIF_INSTALL) + "$"):
            read(items["photo.heic"])


def test_a_16_bit_photo_keeps_its_levels_and_one_of_no_stated_range_is_named(tmp_path):
    from PIL import Image

    from datacentric.data.media_sources import MediaItem

    def item(name):
        return MediaItem(0, tmp_path / name, name, "a cat", name)

    # a 16-bit greyscale ramp (Pillow mode I;16), stored 32 x 48, shown turned (EXIF 6)
    levels = np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) * 43
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(levels).save(tmp_path / "deep.png", exif=exif)
    info = probe(item("deep.png"))
    assert (info.height, info.width, info.rotated) == (48, 32, True)
    (got,) = decode(item("deep.png"))
    high_byte = np.rot90(levels >> 8, k=-1).astype(np.uint8)  # as a 16-bit RGB PNG reads
    assert np.array_equal(np.asarray(got), np.stack([high_byte] * 3, -1))
    Image.fromarray(levels.astype(np.float32) / 65535).save(tmp_path / "hdr.tiff")
    for read in (probe, decode):
        with pytest.raises(MediaError, match=r"^a floating-point image \(Pillow mode F\) states"):
            read(item("hdr.tiff"))


@pytest.mark.parametrize("suffix", [".tiff", ".jpg", ".png", ".webp"])
def test_every_exif_orientation_gives_the_size_its_frame_is_decoded_at(tmp_path, suffix):
    """probe's upright size is the decoded frame's for each of the 8 orientations: a TIFF
    too, whose size Pillow may report turned already (it turns a TIFF as it loads it)."""
    from PIL import Image

    from datacentric.data.media_sources import MediaItem

    stored = wave_frames(1, 32, 48)[0]
    upright = {  # EXIF orientation -> the stored pixels shown upright
        1: stored,
        2: np.fliplr(stored),
        3: np.rot90(stored, 2),
        4: np.flipud(stored),
        5: np.transpose(stored, (1, 0, 2)),
        6: np.rot90(stored, -1),
        7: np.rot90(np.transpose(stored, (1, 0, 2)), 2),
        8: np.rot90(stored, 1),
    }
    lossless = {".webp": {"lossless": True}, ".jpg": {"quality": 100}}.get(suffix, {})
    for orientation, want in upright.items():
        path = tmp_path / f"photo-{orientation}{suffix}"
        exif = Image.Exif()
        exif[0x0112] = orientation
        Image.fromarray(stored).save(path, exif=exif, **lossless)
        item = MediaItem(0, path, path.name, "a cat", path.name)
        info = probe(item)
        (got,) = decode(item)
        assert (info.height, info.width) == want.shape[:2] == (got.height, got.width), path
        assert info.rotated == (orientation != 1)
        tolerance = 8 if suffix == ".jpg" else 0  # JPEG's loss, never a turn's
        assert np.abs(np.asarray(got, dtype=int) - want).mean() <= tolerance, path


def test_a_clip_trimmed_by_its_edit_list_has_the_frames_that_play(tmp_path):
    """An MP4 cut without re-encoding (its first 4 of 12 frames trimmed by an edit list, as
    a stream copy from a time writes it) states 12 frames; 8 play and decode. probe counts
    the 8: it said 12, and prepare skipped the clip as 'only 8 frames decode, 9 wanted'."""
    import av

    from datacentric.data.media_sources import MediaItem

    path = tmp_path / "cut.mp4"
    written = wave_frames(12, 32, 48)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        stream.options = {"crf": "0", "preset": "ultrafast", "bf": "0"}
        packets = [p for f in written for p in stream.encode(av.VideoFrame.from_ndarray(f))]
        packets += list(stream.encode())
        tick = sorted(p.pts for p in packets)[1]  # one frame in the stream's time base
        for packet in packets:  # the first 4 frames before time 0: trimmed by an edit list
            packet.pts, packet.dts = packet.pts - 4 * tick, packet.dts - 4 * tick
            container.mux(packet)
    with av.open(str(path)) as container:  # what the container states, what plays
        assert container.streams.video[0].frames == 12
        plays = [np.asarray(f.to_image()) for f in container.decode(video=0)]
    assert len(plays) == 8
    item = MediaItem(0, path, path.name, "a cat", path.name)
    info = probe(item)
    assert info.frames == 8
    got = decode(item, list(range(info.frames)))
    assert all(map(np.array_equal, map(np.asarray, got), plays))


def test_a_clip_of_non_square_pixels_is_read_as_players_show_it(tmp_path):
    import av
    from PIL import Image

    from datacentric.data.media_sources import MediaItem

    # H.264 in MP4 stored 32 x 48, each pixel twice as wide as high (as the stream
    # states), turned 90 degrees: shown 32 x 96 before the turn, 96 x 32 after
    path = tmp_path / "wide.mp4"
    written = wave_frames(5, 32, 48)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        stream.codec_context.sample_aspect_ratio = Fraction(2, 1)
        stream.set_display_rotation(90)
        for pixels in written:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    item = MediaItem(0, path, path.name, "a cat", path.name)
    assert (probe(item).height, probe(item).width) == (96, 32)
    with av.open(str(path)) as container:  # the stored pixels, as the decoder gives them
        stored = [f.to_image() for f in container.decode(video=0)]
    shown = [
        np.rot90(np.asarray(f.resize((96, 32), Image.Resampling.LANCZOS)), k=1) for f in stored
    ]
    assert all(map(np.array_equal, map(np.asarray, decode(item)), shown))


class _Tokens:
    """A caption's tokens as ``prepare`` counts them: 3 each, of 512."""

    limit = 512

    def __call__(self, caption: str) -> int:
        return 3


def test_an_animated_webp_or_png_is_a_clip_and_a_one_frame_gif_a_still(tmp_path):
    from PIL import Image

    from datacentric.data.media_sources import MediaItem
    from datacentric.data.video_geometry import Geometry
    from datacentric.prepare.plan import PrepareJob, plan_task

    frames = wave_frames(9, 32, 48)
    pictures = [Image.fromarray(f) for f in frames]
    pictures[0].save(
        tmp_path / "a.webp", save_all=True, append_images=pictures[1:], duration=125, lossless=True
    )
    pictures[0].save(tmp_path / "a.png", save_all=True, append_images=pictures[1:], duration=125)
    # an MPO photo (a phone's JPEG with a second picture): one image, as viewers show it
    pictures[0].save(tmp_path / "m.jpg", "MPO", save_all=True, append_images=pictures[1:2])
    for name in ("a.webp", "a.png"):
        item = MediaItem(0, tmp_path / name, name, "a cat", name)
        info = probe(item, times=True)
        assert (info.frames, info.height, info.width) == (9, 32, 48), name
        assert info.times == tuple(Fraction(n, 8) for n in range(9)), name
        assert all(map(np.array_equal, map(np.asarray, decode(item)), frames)), name
        assert np.array_equal(np.asarray(decode(item, [4])[0]), frames[4]), name
        job = PrepareJob(pipeline="p", media=str(tmp_path), out="o", target_fps=4)
        task = plan_task(item, Geometry(4, 16), None, job, _Tokens(), {})
        assert task.plan.frames == (0, 2, 4, 6, 8), name  # a clip at 8 fps, resampled to 4
    item = MediaItem(0, tmp_path / "m.jpg", "m.jpg", "a cat", "m.jpg")
    assert probe(item).frames == 1 and len(decode(item)) == 1
    # a GIF of one frame is a still image, as viewers show it (not a clip too short)
    pictures[0].save(tmp_path / "still.gif")
    item = MediaItem(0, tmp_path / "still.gif", "still.gif", "a cat", "still.gif")
    task = plan_task(item, Geometry(4, 16), None, job, _Tokens(), {})
    assert (task.skip, task.plan.frames, task.plan.bucket) == (None, (0,), "1x32x48")


def test_a_jpeg_saved_as_jfif_or_jpe_and_an_apng_are_read(tmp_path):
    names = ("a.jfif", "b.JPE", "c.apng")
    written = {name: _still(tmp_path / name, n) for n, name in enumerate(names)}
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.txt").write_text(f"{name}: a cat")
    items = read_media_source(tmp_path)
    assert [(i.source, i.caption, i.unread, i.is_image) for i in items] == [
        ("a.jfif", "a: a cat", None, True),
        ("b.JPE", "b: a cat", None, True),
        ("c.apng", "c: a cat", None, True),
    ]
    for item in items[:2]:
        error = np.abs(np.asarray(decode(item)[0], float) - written[item.source]).mean()
        assert error < 25, item.source  # a JPEG's loss: another picture is 79 off
    assert np.array_equal(np.asarray(decode(items[2])[0]), written["c.apng"])


def _layout(folder) -> None:
    """A musubi-tuner folder as found: clips, captions and what else users keep there."""
    for name in ("a.mp4", "d.mp4", "sub/f.mxf", "sub/.hidden/g.mp4"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    for name in ("a", "b", "c", "d", "sub/f", "sub/e", "sub/.hidden/g", "sub/.hidden/h"):
        (folder / f"{name}.txt").write_text(f"{name}: a cat")
    (folder / "b.xyz").write_bytes(b"\x00")  # a kind with no reader, captioned
    (folder / "k.png").write_bytes(b"")  # captioned by its full name: k.png.txt
    (folder / "k.png.txt").write_text("k: a cat")
    (folder / "d.json").write_text("{}")  # a clip's side file: the clip is read
    (folder / "notes.md").write_text("no caption: not a sample")
    (folder / ".DS_Store").write_bytes(b"\x00")
    (folder / "c").mkdir()  # a folder named as the caption: no clip


def test_a_folder_names_each_captioned_file_no_sample_comes_of(tmp_path):
    _layout(tmp_path)
    items = read_media_source(tmp_path)
    listed = [(i.source, i.caption, (i.unread or "").split(" (")[0]) for i in items]
    assert listed == [
        ("a.mp4", "a: a cat", ""),
        ("b.xyz", None, "not a clip or image prepare reads"),
        ("c.txt", None, "a caption with no clip or image beside it"),
        ("d.mp4", "d: a cat", ""),
        ("k.png", None, ""),
        (
            "k.png.txt",
            None,
            "names its clip or image with its suffix: k.png.txt is read as no "
            "caption of k.png; rename it k.txt",
        ),
        ("sub/.hidden/g.mp4", "sub/.hidden/g: a cat", ""),  # named clips are read, as before
        ("sub/e.txt", None, "a caption with no clip or image beside it"),
        ("sub/f.mxf", "sub/f: a cat", ""),
    ]
    assert "(suffix .xyz; docs/prepare.md lists the kinds)" in items[1].unread
    assert items[1].where == str(tmp_path / "b.txt")
    only = tmp_path / "only"
    only.mkdir()
    (only / "x.mts.bak").write_bytes(b"")
    (only / "x.mts.txt").write_text("a cat")
    with pytest.raises(DataError, match=r"lists no clip or image \(the first file not read, x"):
        read_media_source(only)


def test_prepare_skips_an_unread_file_under_every_caption_rule(tmp_path):
    from datacentric.data.video_geometry import Geometry
    from datacentric.prepare.plan import PrepareJob, plan_task

    _layout(tmp_path)
    job = PrepareJob(pipeline="p", media=str(tmp_path), out="o", caption_rule="error")
    unread = [i for i in read_media_source(tmp_path) if i.unread]
    tasks = [plan_task(i, Geometry(4, 16), None, job, None, {}) for i in unread]
    assert [(t.plan, t.skip) for t in tasks] == [(None, i.unread) for i in unread]


@pytest.mark.usefixtures("one_thread", "no_heif_plugin")
def test_a_folder_of_other_kinds_is_prepared_and_what_is_not_read_is_named(tmp_path):
    pytest.importorskip("diffusers")
    import torch
    from diffusers import WanPipeline
    from PIL import Image
    from prepare_media import decoded_frames, save_wan_pipeline
    from runtime.prepare.test_prepare_media import _vae_latent
    from safetensors.torch import load_file

    from datacentric.prepare import PrepareJob, prepare

    media = tmp_path / "media"
    media.mkdir()
    clips = {"phone.3gp": 5, "old.mpg": 9, "cam.ts": 5}
    for number, (name, frames) in enumerate(clips.items()):
        spec = SUFFIX_FORMATS["." + name.split(".")[1]]
        write_format_clip(media / name, frames, 32, 48, seed=number, rate=25, spec=spec)
    _still(media / "scan.tif")
    (media / "photo.heic").write_bytes(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic")
    (media / "clip.xyz").write_bytes(b"\x00")
    for name in (*clips, "scan.tif", "photo.heic", "clip.xyz", "lonely.tif"):
        (media / name).with_suffix(".txt").write_text("a cat walks on the grass")
    pipe_dir = save_wan_pipeline(tmp_path / "pipe")
    job = PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(tmp_path / "o"))
    report = prepare(dataclasses.replace(job, caption_rule="error"))

    skipped = {s["source"]: s["reason"] for s in report["skipped_files"]}
    assert set(skipped) == {"photo.heic", "clip.xyz", "lonely.txt"}
    assert skipped["photo.heic"].endswith(HEIF_INSTALL)
    assert skipped["clip.xyz"].startswith("not a clip or image prepare reads (suffix .xyz")
    assert skipped["lonely.txt"].startswith("a caption with no clip or image beside it")
    assert (report["clips"], report["samples"], report["skipped"]) == (7, 4, 3)
    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    lines = (tmp_path / "o" / "manifest.jsonl").read_text().splitlines()
    for entry in map(json.loads, lines):
        name = entry["source"]
        if name == "scan.tif":
            with Image.open(media / name) as image:
                frames = [image.convert("RGB")]
        else:
            frames = decoded_frames(media / name)[: (clips[name] - 1) // 4 * 4 + 1]
        got = load_file(tmp_path / "o" / entry["latent"])["latent"]
        assert got.shape == (1 + (len(frames) - 1) // 4, 4, 4, 6), name
        torch.testing.assert_close(got, _vae_latent(pipe, frames, 32, 48), rtol=0, atol=1e-5)
    assert sorted(json.loads(line)["source"] for line in lines) == sorted([*clips, "scan.tif"])
