"""Still images and animations reach training as viewers and browsers show them: each
case written with Pillow and read back against what was written (the frames, their
times as browsers play them, the reason a file is not read)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from datacentric.data.frame_sampling import FrameSampling, frame_line
from datacentric.data.media_decode import MediaError, decode, probe
from datacentric.data.media_sources import MediaItem

pytest.importorskip("av")
pytest.importorskip("PIL")


def _item(path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


@pytest.mark.parametrize("name", ["a.gif", "a.png", "a.webp"])
def test_a_frame_of_ten_milliseconds_or_less_is_timed_as_browsers_show_it(tmp_path, name):
    from PIL import Image

    pictures = [Image.new("RGB", (32, 24), (60 * n, 90, 30)) for n in range(5)]
    durations = [10, 20, 0, 5, 50]  # ms; Chromium and Firefox show 10 ms or less 100 ms
    options = {".gif": {"loop": 0}, ".png": {}, ".webp": {"lossless": True}}[
        name[name.index(".") :]
    ]
    pictures[0].save(
        tmp_path / name, save_all=True, append_images=pictures[1:], duration=durations, **options
    )
    times = probe(_item(tmp_path / name), times=True).times
    assert times == tuple(Fraction(ms, 1000) for ms in (0, 100, 120, 220, 320)), name
    # resampled to 10 fps by time, not index: the frames nearest 0, 100, 200 and 300 ms
    assert frame_line(5, times, FrameSampling(target_fps=10)) == [0, 1, 3, 4], name


def test_a_very_large_picture_is_read_quietly_and_one_past_pillow_s_limit_named_with_the_fix(
    tmp_path, monkeypatch
):
    import warnings

    import numpy as np
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # warns above 1000, refuses 2000
    written = np.arange(40 * 30 * 3, dtype=np.uint32).reshape(30, 40, 3).astype(np.uint8)
    Image.fromarray(written).save(tmp_path / "large.png")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        info = probe(_item(tmp_path / "large.png"))
        picture = decode(_item(tmp_path / "large.png"))[0]
    assert (info.height, info.width) == (30, 40) and np.array_equal(picture, written)
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]
    Image.new("RGB", (50, 50)).save(tmp_path / "huge.png")
    with pytest.raises(MediaError) as refused:
        probe(_item(tmp_path / "huge.png"))
    assert str(refused.value) == (
        "too large to read: 2500 pixels, over the 2000 Pillow reads (as a guard against "
        "decompression bombs): scale it down to 2000 pixels or fewer first"
    )


def test_a_gif_s_transparent_pixels_are_white_in_every_frame(tmp_path):
    """FFmpeg's GIF decoder shows a transparent pixel white, not the colour its palette
    stores under it (Pillow's reading), on the first frame and where a frame is cleared
    to the background; every frame composed over the ones before (a frame smaller than
    the picture at an offset, restored to the background or to the frame before)."""
    import numpy as np
    from PIL import Image

    first = Image.new("P", (32, 24), 0)  # index 0: (10, 20, 30), transparent
    first.putpalette([10, 20, 30, 200, 100, 50, 30, 200, 30] + [0] * 759)
    first.paste(1, (8, 8, 24, 16))
    second = first.copy()
    second.paste(2, (2, 2, 6, 6))
    third = Image.new("P", (32, 24), 0)
    third.putpalette(first.getpalette())
    third.paste(2, (20, 4, 28, 10))
    first.save(
        tmp_path / "a.gif",
        save_all=True,
        append_images=[second, third],
        transparency=0,
        disposal=[1, 2, 1],  # the second (Pillow writes its 4 x 4 square alone) cleared
        duration=100,
        loop=0,
    )
    white, orange, green = (255, 255, 255), (200, 100, 50), (30, 200, 30)
    want = [np.full((24, 32, 3), white, np.uint8) for _ in range(3)]
    for frame in want:
        frame[8:16, 8:24] = orange  # the first frame's, kept where no frame is cleared
    want[1][2:6, 2:6] = want[2][4:10, 20:28] = green
    got = decode(_item(tmp_path / "a.gif"))
    assert len(got) == 3 and all(map(np.array_equal, map(np.asarray, got), want))


def test_a_png_stating_a_gamma_alone_is_read_as_stored_as_browsers_show_it(tmp_path):
    """A gAMA chunk without cHRM is passed over by Chromium, Firefox and Safari (Blink's
    PNG decoder builds no colour profile of it), and so here: the levels as written."""
    import struct

    import numpy as np
    from PIL import Image, PngImagePlugin

    written = np.arange(24 * 32 * 3, dtype=np.uint32).reshape(24, 32, 3).astype(np.uint8)
    chunks = PngImagePlugin.PngInfo()
    chunks.add(b"gAMA", struct.pack(">I", 100000))  # linear light, 1.0
    Image.fromarray(written).save(tmp_path / "linear.png", pnginfo=chunks)
    with Image.open(tmp_path / "linear.png") as image:
        assert image.info["gamma"] == 1.0  # the chunk was written and is read
    assert np.array_equal(decode(_item(tmp_path / "linear.png"))[0], written)


def test_an_apng_frame_restored_to_the_one_before_is_gone_from_the_next(tmp_path):
    """APNG's dispose to the previous frame (APNG_DISPOSE_OP_PREVIOUS, as apngasm writes
    it) over a blended frame: Pillow 13 composes such a frame into the canvas it keeps to
    restore from, so the next frame read after it kept it; each frame is the picture
    written, as FFmpeg's APNG decoder and browsers compose it."""
    import numpy as np
    from PIL import Image, PngImagePlugin

    red, green, blue = (200, 30, 30, 255), (30, 200, 30, 255), (30, 30, 200, 255)
    frames = [Image.new("RGBA", (32, 24), red) for _ in range(4)]
    frames[1].paste(green, (4, 4, 14, 14))  # shown once, then restored to the frame before
    frames[2].paste(blue, (16, 8, 28, 20))
    frames[3].paste(green, (20, 2, 30, 6))
    disposal, blend = PngImagePlugin.Disposal, PngImagePlugin.Blend
    frames[0].save(
        tmp_path / "a.png",
        save_all=True,
        append_images=frames[1:],
        duration=100,
        disposal=[disposal.OP_NONE, disposal.OP_PREVIOUS, disposal.OP_PREVIOUS, disposal.OP_NONE],
        blend=[blend.OP_SOURCE, blend.OP_OVER, blend.OP_OVER, blend.OP_OVER],
    )
    written = [np.asarray(frame.convert("RGB")) for frame in frames]
    for indices in (None, [1, 2, 3], [2, 3]):
        got = decode(_item(tmp_path / "a.png"), indices)
        want = written if indices is None else [written[i] for i in indices]
        assert all(map(np.array_equal, map(np.asarray, got), want)), indices


def test_an_animated_avif_is_a_clip_of_its_frames(tmp_path):
    """An AVIF image sequence (as phones and converters write animations) is a clip of
    every frame at its time, as an animated WebP or PNG is: it was its first frame."""
    import numpy as np
    from media_formats import wave_frames
    from PIL import Image, features

    if not features.check("avif"):
        pytest.skip("this Pillow is built without libavif")
    written = wave_frames(5, 32, 48)
    pictures = [Image.fromarray(frame) for frame in written]
    pictures[0].save(
        tmp_path / "a.avif",
        save_all=True,
        append_images=pictures[1:],
        duration=[100, 200, 100, 50, 100],
        quality=100,
        subsampling="4:4:4",
    )
    info = probe(_item(tmp_path / "a.avif"), times=True)
    assert (info.frames, info.height, info.width) == (5, 32, 48)
    assert info.times == tuple(Fraction(ms, 1000) for ms in (0, 100, 300, 400, 450))
    got = [np.asarray(p, float) for p in decode(_item(tmp_path / "a.avif"))]
    errors = [[np.abs(g - w).mean() for w in written] for g in got]
    assert all(np.argmin(row) == n and row[n] < 3 for n, row in enumerate(errors)), errors


def test_an_apng_s_default_image_outside_its_animation_is_no_frame(tmp_path):
    """An APNG whose plain PNG picture is no frame of its animation (a still for viewers
    without APNG: no fcTL before its IDAT) is a clip of its animation's frames alone, as
    browsers and FFmpeg play it: the still was its first frame."""
    import numpy as np
    from PIL import Image, PngImagePlugin

    written = [np.full((24, 32, 3), (60 * n, 90, 200), np.uint8) for n in range(3)]
    still = Image.new("RGB", (32, 24), (255, 255, 0))
    animation = [Image.fromarray(frame) for frame in written]
    still.save(
        tmp_path / "a.png",
        save_all=True,
        append_images=animation,
        default_image=True,
        duration=[100, 200, 100],
    )
    info = probe(_item(tmp_path / "a.png"), times=True)
    assert info.frames == 3 and info.times == (0, Fraction(1, 10), Fraction(3, 10))
    got = decode(_item(tmp_path / "a.png"))
    assert all(map(np.array_equal, map(np.asarray, got), written))
    assert np.array_equal(decode(_item(tmp_path / "a.png"), [2])[0], written[2])
    # the animation starts on a transparent canvas, not over the still: a first frame
    # transparent but for a red square shows black (its alpha dropped) around it
    first = Image.new("RGBA", (32, 24), (0, 0, 0, 0))
    first.paste((200, 30, 30, 255), (0, 0, 8, 8))
    over = PngImagePlugin.Blend.OP_OVER  # drawn over the canvas by its alpha
    still.save(
        tmp_path / "b.png", save_all=True, append_images=[first], default_image=True, blend=over
    )
    (got,) = decode(_item(tmp_path / "b.png"))
    assert np.array_equal(got, np.asarray(first.convert("RGB")))


def test_a_half_transparent_apng_frame_is_blended_as_browsers_blend_it(tmp_path):
    """An APNG frame blended over the one before (APNG_BLEND_OP_OVER) where it is half
    transparent: over transparent pixels its colour as written (its alpha dropped, as a
    still's is), over opaque ones the two mixed by its alpha, as FFmpeg's APNG decoder
    and browsers blend; Pillow 13 pasted it through its alpha as a mask (half its colour
    over transparent black), and the frame after kept that."""
    import numpy as np
    from PIL import Image, PngImagePlugin

    first = Image.new("RGBA", (32, 24), (0, 0, 0, 0))
    first.paste((200, 30, 30, 255), (0, 0, 8, 8))
    second = first.copy()
    second.paste((30, 200, 30, 128), (10, 10, 20, 20))  # over transparent pixels
    second.paste((30, 200, 30, 128), (4, 4, 8, 8))  # over opaque red
    third = second.copy()
    third.paste((30, 30, 200, 255), (24, 2, 30, 6))
    blend = PngImagePlugin.Blend
    first.save(
        tmp_path / "a.png",
        save_all=True,
        append_images=[second, third],
        duration=100,
        blend=[blend.OP_SOURCE, blend.OP_OVER, blend.OP_OVER],
    )
    mixed = np.round(np.array([30, 200, 30]) * 128 / 255 + np.array([200, 30, 30]) * 127 / 255)
    want = np.asarray(second.convert("RGB")).copy()
    want[4:8, 4:8] = mixed
    got = [np.asarray(p, int) for p in decode(_item(tmp_path / "a.png"))]
    assert np.abs(got[1] - want).max() <= 1
    want[2:6, 24:30] = (30, 30, 200)
    assert np.abs(got[2] - want).max() <= 1
    assert np.array_equal(decode(_item(tmp_path / "a.png"), [2])[0], got[2])  # passing 1


def test_an_avif_sequence_saved_as_avifs_is_listed_and_read(tmp_path):
    """``.avifs``, the suffix of an AVIF image sequence, is listed by a folder as an image
    (a clip of its frames) with its caption, not skipped as a kind prepare reads not."""
    from PIL import Image, features

    from datacentric.data.media_sources import read_media_source

    if not features.check("avif"):
        pytest.skip("this Pillow is built without libavif")
    pictures = [Image.new("RGB", (48, 32), (60 * n, 90, 200)) for n in range(3)]
    pictures[0].save(tmp_path / "a.avifs", "AVIF", save_all=True, append_images=pictures[1:])
    (tmp_path / "a.txt").write_text("a cat")
    (item,) = read_media_source(tmp_path)
    assert (item.source, item.caption, item.unread) == ("a.avifs", "a cat", None)
    assert item.is_image
    assert probe(item).frames == 3 and len(decode(item)) == 3


def _write_png16(path, levels) -> None:
    """A 16-bit RGB PNG of ``levels`` (height x width x 3, ``uint16``), chunk by chunk."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        check = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + check

    height, width = levels.shape[:2]
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in levels)
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _still_kinds(path, written):
    """Writes ``written`` (RGB) as the still kind ``path``'s name says; what it shows."""
    import numpy as np
    from PIL import Image

    picture, grey = Image.fromarray(written), written[..., 1]
    kind = path.stem
    if kind == "palette_trns":  # a palette PNG with a transparent entry: its colour kept
        palette = picture.quantize(64)
        palette.save(path, transparency=3)
        return np.asarray(palette.convert("RGB"))
    if kind == "rgb16":  # 16-bit RGB, which Pillow writes not: each level's high byte
        levels = written.astype(np.uint16) * 256 + np.arange(48, dtype=np.uint16)[:, None] * 5
        _write_png16(path, levels)
        return (levels >> 8).astype(np.uint8)
    if kind == "grey_alpha":  # an LA PNG: its grey kept under any alpha
        Image.fromarray(np.dstack([grey, written[..., 0]]), "LA").save(path)
        return np.repeat(grey[..., None], 3, -1)
    if kind == "grey_jpeg":
        Image.fromarray(grey).save(path, quality=100)
        return np.repeat(grey[..., None], 3, -1)
    if kind == "cmyk_jpeg":  # Pillow writes Adobe's inverted CMYK, as Photoshop does
        picture.convert("CMYK").save(path, quality=100)
        return written
    if kind == "one_bit":
        Image.fromarray(grey > 127).save(path, compression="group4")
        return np.repeat(np.where(grey > 127, 255, 0)[..., None], 3, -1).astype(np.uint8)
    picture.save(path, save_all=True, append_images=[Image.fromarray(255 - written)])
    return written  # a TIFF of two pages: its first (the second is no frame)


@pytest.mark.parametrize(
    "name",
    [
        "palette_trns.png",
        "rgb16.png",
        "grey_alpha.png",
        "grey_jpeg.jpg",
        "cmyk_jpeg.jpg",
        "one_bit.tif",
        "two_pages.tif",
    ],
)
def test_a_still_of_each_kind_shows_the_colours_written(tmp_path, name):
    import numpy as np
    from media_formats import wave_frames

    written = wave_frames(1, 32, 48)[0]
    shown = _still_kinds(tmp_path / name, written)
    info = probe(_item(tmp_path / name))
    assert (info.frames, info.height, info.width) == (1, 32, 48)
    (got,) = decode(_item(tmp_path / name))
    error = np.abs(np.asarray(got, float) - shown)
    assert error.mean() < 1 and error.max() <= 8, (name, error.mean(), error.max())


def test_the_video_extra_asks_for_a_pillow_that_reads_tiffs_as_viewers_show_them():
    """Pillow before 10.1 leaves a TIFF's EXIF mirror undone and cannot decode a TIFF of
    several pages ('NoneType' object has no attribute 'seek'), measured with 10.0.1 and
    9.5.0 first on the path (10.1.0 and later read both as this file's cases and
    test_media_kinds' orientations want): the ``video`` extra asks for 10.1 or later."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["video"]
    (pillow,) = [Requirement(r) for r in extra if Requirement(r).name.lower() == "pillow"]
    assert not pillow.specifier.contains("10.0.1") and not pillow.specifier.contains("9.5.0")
    assert pillow.specifier.contains("10.1.0")
