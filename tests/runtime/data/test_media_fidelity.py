"""What a clip holds reaches ``prepare`` as a player shows it: the frames that play of a
clip cut before its first keyframe, the file's own colour matrix and range, levels of
more than 8 bits, colours under an alpha channel, and the stream players pick. Each clip
is written with PyAV (the decoder's own library), losslessly where the codec allows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from media_formats import rgb_profile, srgb_curve, wave_frames

from datacentric.data.media_decode import COVER_PICTURE, DEFAULT_STREAM, decode, probe
from datacentric.data.media_sources import MediaItem

pytest.importorskip("av")

#: lossless H.264 in 4:4:4 with a keyframe every 4 frames and no B-frames
H264_GOP4 = {"qp": "0", "preset": "ultrafast", "g": "4", "bf": "0"}


def _item(path: Path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


def _error(got, want) -> float:
    """The mean absolute difference of a decoded picture from the pixels written."""
    return float(np.abs(np.asarray(got, dtype=float) - want).mean())


@pytest.mark.parametrize(
    ("name", "codec", "pixels", "options"),
    [
        ("cut.mp4", "libx264", "yuv444p", H264_GOP4),
        ("cut.mov", "libx264", "yuv444p", H264_GOP4),
        ("cut.webm", "libvpx-vp9", "yuv420p", {"g": "4"}),
    ],
)
def test_a_clip_cut_before_its_first_keyframe_has_the_frames_that_play(
    tmp_path, name, codec, pixels, options
):
    """A clip cut from a longer one without re-encoding, its first 2 of 12 frames gone
    (a keyframe every 4): players show the 8 frames from the next keyframe on. An MP4 or
    MOV states 10 frames: probe said 10 and decode failed 'only 8 frames decode, 9
    wanted', so prepare skipped the clip; VP9 refuses the frames before the keyframe,
    and the WebM was skipped as 'corrupt or unreadable video (InvalidDataError ...)'."""
    import av

    path = tmp_path / name
    written = wave_frames(12, 32, 48)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, pixels
        stream.options = dict(options)
        packets = [p for f in written for p in stream.encode(av.VideoFrame.from_ndarray(f))]
        packets += list(stream.encode())
        assert [p.is_keyframe for p in packets[:5]] == [True, False, False, False, True]
        for packet in packets[2:]:
            container.mux(packet)
    item = _item(path)
    assert probe(item).frames == probe(item, times=True).frames == 8
    got = decode(item, list(range(8)))
    tolerance = 1 if codec == "libx264" else 12  # VP9's loss; another frame is 30 off
    assert all(_error(g, w) < tolerance for g, w in zip(got, written[4:])), name


@pytest.mark.parametrize("container_format", ["mp4", "matroska", "mov"])
def test_a_file_of_two_video_streams_is_read_at_the_one_players_show(tmp_path, container_format):
    """Two video streams, the second marked the default (the track a player opens: FFmpeg's
    own choice, mpv's, VLC's): its frames are the clip. The first stream was read: other
    pictures, silently."""
    import av

    path = tmp_path / f"two.{container_format}"
    other, shown = wave_frames(5, 16, 16, seed=1), wave_frames(9, 32, 48, seed=2)
    with av.open(str(path), "w", format=container_format) as container:
        streams = []
        for frames, default in ((other, False), (shown, True)):
            stream = container.add_stream("libx264", rate=8)
            height, width = frames[0].shape[:2]
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
            stream.options = dict(H264_GOP4)
            stream.disposition = DEFAULT_STREAM if default else 0
            streams.append((stream, frames))
        for stream, frames in streams:
            for pixels in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels)):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    item = _item(path)
    info = probe(item)
    assert (info.frames, info.height, info.width) == (9, 32, 48)
    got = decode(item)
    assert len(got) == 9 and all(_error(g, w) < 1 for g, w in zip(got, shown))


def test_an_audio_file_with_a_cover_picture_is_named_as_no_clip(tmp_path):
    """An MP4 of sound and its artwork (a cover picture, one still): no video stream.
    prepare skipped it as 'too short: 1 frame, the VAE needs 5', the cover read as a
    clip."""
    import av
    from media_formats import _audio

    from datacentric.data.media_decode import MediaError

    path = tmp_path / "song.mp4"
    with av.open(str(path), "w", format="mp4") as container:
        sound = container.add_stream("aac", rate=8000)
        cover = container.add_stream("mjpeg", rate=1)
        cover.width, cover.height, cover.pix_fmt = 32, 48, "yuvj420p"
        cover.disposition = COVER_PICTURE
        picture = av.VideoFrame.from_ndarray(wave_frames(1, 48, 32)[0])
        for packet in [*cover.encode(picture), *cover.encode()]:
            container.mux(packet)
        _audio(container, sound, 1.0)
    for read in (probe, decode):
        with pytest.raises(MediaError, match=r"^no video stream \(audio streams and a cover"):
            read(_item(path))


def test_the_stream_shown_is_found_whatever_type_pyav_gives_its_disposition():
    """PyAV 16 and 17 give a stream's disposition as an ``enum.Flag`` (no ``int()``), 18
    as an ``IntFlag``, 12 none: each reads (it failed every clip on 16 and 17 as
    'corrupt or unreadable video (TypeError: int() argument must be ...)')."""
    import enum
    from types import SimpleNamespace

    from datacentric.data.media_decode import _shown_stream

    class Flag(enum.Flag):  # PyAV 16's and 17's av.stream.Disposition, in short
        none, default, attached_pic = 0, DEFAULT_STREAM, COVER_PICTURE

    for kind in (Flag, enum.IntFlag("IntFlag", {"default": 1, "attached_pic": 1024})):
        streams = [SimpleNamespace(disposition=kind(0)), SimpleNamespace(disposition=kind(1))]
        assert _shown_stream(streams) is streams[1]
        assert _shown_stream([SimpleNamespace(disposition=kind(COVER_PICTURE))]) is None
    streams = [SimpleNamespace(), SimpleNamespace()]
    assert _shown_stream(streams) is streams[0]


#: FFmpeg's colour matrices (``AVColorSpace``) -> the red and blue weights of luma
MATRICES = {1: (0.2126, 0.0722), 5: (0.299, 0.114)}  # BT.709; BT.601 (BT.470BG)


def _yuv_to_rgb(planes: np.ndarray, full_range: bool, matrix: int) -> np.ndarray:
    """RGB levels of 8-bit 4:4:4 Y, Cb and Cr planes by the matrix's equations, computed
    here (not by the decoder's scaler): the reference the decoded frames must match."""
    kr, kb = MATRICES[matrix]
    y, cb, cr = planes.astype(float)
    if full_range:
        y, cb, cr = y / 255, (cb - 128) / 255, (cr - 128) / 255
    else:
        y, cb, cr = (y - 16) / 219, (cb - 128) / 224, (cr - 128) / 224
    red, blue = y + 2 * (1 - kr) * cr, y + 2 * (1 - kb) * cb
    green = (y - kr * red - kb * blue) / (1 - kr - kb)
    return np.clip(np.round(np.stack([red, green, blue], -1) * 255), 0, 255)


@pytest.mark.parametrize("matrix", sorted(MATRICES))
@pytest.mark.parametrize("full_range", [False, True])
def test_colours_are_converted_by_the_matrix_and_range_the_file_states(
    tmp_path, matrix, full_range
):
    """FFV1 (lossless) Y, Cb and Cr planes tagged BT.709 or BT.601, limited (16-235) or
    full (0-255) range: the RGB frames are the planes converted by the file's tags."""
    import av

    y, x = np.mgrid[0:32, 0:48]
    low, high = (0, 255) if full_range else (16, 235)
    planes = np.stack(
        [low + (high - low) * x / 47, low + (high - low) * y / 31, 128 + 100 * np.sin(x + y)]
    ).astype(np.uint8)
    path = tmp_path / "tagged.mkv"
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv444p"
        tags = (2 if full_range else 1), matrix
        stream.codec_context.color_range, stream.codec_context.colorspace = tags
        for _ in range(2):
            frame = av.VideoFrame.from_ndarray(planes, format="yuv444p")
            frame.color_range, frame.colorspace = tags
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:  # the file states what was written
        frame = next(container.decode(video=0))
        assert (frame.color_range, frame.colorspace) == tags
    want = _yuv_to_rgb(planes, full_range, matrix)
    assert all(_error(got, want) < 0.05 for got in decode(_item(path)))


def test_a_pyav_that_converts_every_clip_as_bt601_is_named_as_the_reason(tmp_path, monkeypatch):
    """PyAV 16 and earlier convert a BT.709 or full-range clip as BT.601 of limited range
    (7.3 levels off on average for the BT.709 ramp above, 5.5 for the full-range BT.601
    one): each clip is skipped naming the PyAV to install, not read in other colours."""
    import av

    from datacentric.data.media_decode import MediaError

    path = tmp_path / "clip.mp4"
    path.write_bytes(b"")
    monkeypatch.setattr(av, "__version__", "16.1.0")
    for read in (probe, decode):
        with pytest.raises(MediaError, match=r"^PyAV 16\.1\.0 converts every clip's colours as BT"):
            read(_item(path))


@pytest.mark.parametrize(
    ("name", "codec", "pixels"),
    [
        ("ten_bit.mkv", "ffv1", "yuv444p10le"),
        ("twelve_bit.mkv", "ffv1", "yuv444p12le"),
        ("ten_bit_rgb.mkv", "ffv1", "gbrp10le"),
        ("ten_bit.mp4", "libx264", "yuv444p10le"),
        ("alpha.mov", "png", "rgba"),
        ("alpha.mkv", "ffv1", "bgra"),
        ("alpha_4444.mov", "prores_ks", "yuva444p10le"),
    ],
)
def test_deep_levels_and_an_alpha_channel_keep_the_colours_written(tmp_path, name, codec, pixels):
    """10- and 12-bit levels are scaled to 8 bits (not clipped, nor read dark), and a clip
    with an alpha channel is read at its colours as stored, the alpha dropped (not
    composited over a background): each frame within a level of the RGB written."""
    import av

    path = tmp_path / name
    written = wave_frames(3, 32, 48)
    alpha = np.broadcast_to(np.arange(48, dtype=np.uint8)[None, :, None] * 5, (32, 48, 1))
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, pixels
        stream.options = {"qp": "0", "preset": "ultrafast"} if codec == "libx264" else {}
        for rgb in written:
            frame = av.VideoFrame.from_ndarray(np.concatenate([rgb, alpha], -1), format="rgba")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    got = decode(_item(path))
    assert len(got) == 3 and all(_error(g, w) < 1 for g, w in zip(got, written)), name


def _tagged_greys(path: Path, transfer: int, primaries: int, signal: np.ndarray) -> None:
    """A 10-bit FFV1 clip of greys (lossless), limited range, BT.2020's matrix, tagged
    ``transfer`` and ``primaries``: its luma ``signal`` (0 to 1) across each row."""
    import av

    luma = np.round(64 + 876 * signal).astype(np.uint16)
    planes = [np.tile(luma, (4, 1)), np.full((4, len(signal)), 512, np.uint16)]
    planes.append(planes[1])
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = len(signal), 4, "yuv444p10le"
        tags = {"color_range": 1, "colorspace": 9}
        tags |= {"color_trc": transfer, "color_primaries": primaries}
        for name, value in tags.items():
            setattr(stream.codec_context, name, value)
        frame = av.VideoFrame(len(signal), 4, "yuv444p10le")
        for plane, values in zip(frame.planes, planes):
            row = plane.line_size // 2  # 16-bit samples, rows padded to the line size
            plane.update(np.pad(values, ((0, 0), (0, row - len(signal)))).tobytes())
        for name, value in tags.items():
            setattr(frame, name, value)
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)


@pytest.mark.parametrize(
    ("transfer", "reference_white"),
    [(18, 0.75), (16, 0.58)],  # HLG's 75 % signal; PQ's 203 nits
)
def test_an_hdr_clip_is_shown_as_players_map_it_to_an_ordinary_display(
    tmp_path, transfer, reference_white
):
    """An HDR clip (HLG, as phones record HDR, or PQ) of BT.2020 greys: black stays
    black, the reference white comes out near white, brighter levels clip at white, and
    greys stay grey. Its levels were converted alone: the reference white 191 of 255
    (HLG), 148 (PQ), every grey dim and flat."""
    from datacentric.data.media_colours import maps_to_bt709

    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR to BT.709 (the refusal's test)")
    signal = np.array([0.0, 0.25, 0.5, reference_white, 0.95])
    path = tmp_path / "hdr.mkv"
    _tagged_greys(path, transfer, 9, signal)
    (got,) = decode(_item(path))
    row = np.asarray(got, dtype=int)[0]
    assert (row.max(-1) - row.min(-1) <= 2).all(), row  # greys stay grey
    greys = row[:, 1]
    assert greys[0] <= 2 and greys[3] >= 235 and greys[4] == 255, greys
    assert (np.diff(greys) >= 0).all() and greys[2] > greys[1] > greys[0], greys


def test_an_hdr_clip_the_installed_pyav_cannot_map_is_named(tmp_path, monkeypatch):
    """A PyAV whose scaler cannot map HDR to BT.709 (17.0 takes the arguments and
    converts the levels alone): an HLG clip is skipped naming its colours and the fix."""
    from datacentric.data import media_colours
    from datacentric.data.media_decode import MediaError

    path = tmp_path / "hdr.mkv"
    _tagged_greys(path, 18, 9, np.linspace(0, 1, 8))
    monkeypatch.setattr(media_colours, "maps_to_bt709", lambda: False)
    for read in (probe, decode):  # probe: refused when planned, before any encoding
        with pytest.raises(MediaError, match=r"^colours of HLG transfer, BT.2020 primaries"):
            read(_item(path))


@pytest.mark.parametrize(
    ("height", "width", "matrix"),
    [(578, 16, 1), (16, 1280, 1), (576, 16, 5), (32, 48, 5)],  # 1: BT.709; 5: BT.601
)
def test_a_clip_stating_no_matrix_is_converted_by_the_one_players_guess(
    tmp_path, height, width, matrix
):
    """A clip that states no colour matrix (as many encoders leave it): players take
    BT.709 for high definition (above 576 lines, or 1280 pixels wide or more) and BT.601
    below. FFmpeg's scaler took BT.601 at every size: 7.6 levels off on average for
    these high-definition planes."""
    import av

    y, x = np.mgrid[0:height, 0:width]
    planes = np.stack(
        [16 + 219 * (x % 48) / 47, 16 + 224 * (y % 32) / 31, 128 + 100 * np.sin(x + y)]
    ).astype(np.uint8)
    path = tmp_path / "untagged.mkv"
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
        frame = av.VideoFrame.from_ndarray(planes, format="yuv444p")
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    with av.open(str(path)) as container:  # the file states no matrix, nor range
        stated = next(container.decode(video=0))
        assert (stated.colorspace, stated.color_range) == (2, 0)
    (got,) = decode(_item(path))
    assert _error(got, _yuv_to_rgb(planes, False, matrix)) < 0.05


def _write_timed(
    path: Path, container_format: str, codec: str, ticks: list[int], pixels: str = "yuv444p"
) -> list:
    """A 32 x 48 clip of frames at ``ticks`` (eighths of a second, uneven where they
    skip), lossless 4:4:4 unless ``pixels`` says otherwise; the frames written."""
    from fractions import Fraction

    import av

    written = wave_frames(len(ticks), 32, 48)
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, pixels
        stream.options = dict(H264_GOP4) if codec == "libx264" else {}
        stream.codec_context.time_base = Fraction(1, 8)
        for tick, pixels in zip(ticks, written):
            frame = av.VideoFrame.from_ndarray(pixels)
            frame.pts, frame.time_base = tick, Fraction(1, 8)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return written


@pytest.mark.parametrize("container_format", ["mp4", "matroska"])
def test_uneven_frame_times_from_a_late_start_are_resampled_by_their_timestamps(
    tmp_path, container_format
):
    """A variable-frame-rate clip (uneven timestamps) starting 10 s into its timeline:
    probe gives each frame's own time, and --target-fps picks the frame nearest to each
    step from the first frame's time, not from 0 nor by the average rate."""
    from fractions import Fraction

    from datacentric.data.frame_sampling import FrameSampling, frame_line

    ticks = [80, 81, 82, 85, 86, 90, 91, 92, 100]  # eighths of a second
    path = tmp_path / f"vfr.{container_format}"
    _write_timed(path, container_format, "libx264", ticks)
    info = probe(_item(path), times=True)
    assert info.times == tuple(Fraction(t, 8) for t in ticks)
    # at 4 fps: 0, 0.25, 0.5 ... 2.5 s after the first frame, each to its nearest frame
    line = frame_line(info.frames, info.times, FrameSampling(target_fps=4))
    assert line == [0, 2, 3, 4, 4, 5, 7, 7, 7, 8, 8]  # ties to the earlier frame


def test_a_clip_of_odd_size_keeps_every_row_and_column(tmp_path):
    """33 x 47 in 4:2:0 (chroma of half size, rounded up) and a 1 x 1 clip: read at their
    size, each pixel near the one written (4:2:0's loss at the edges)."""
    import av

    for height, width in ((47, 33), (1, 1)):
        path = tmp_path / f"odd{height}.mkv"
        written = wave_frames(5, height, width)
        with av.open(str(path), "w", format="matroska") as container:
            stream = container.add_stream("ffv1", rate=8)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for pixels in written:
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels)):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        info = probe(_item(path))
        assert (info.frames, info.height, info.width) == (5, height, width)
        got = decode(_item(path))
        assert [g.size for g in got] == [(width, height)] * 5
        assert all(_error(g, w) < 4 for g, w in zip(got, written)), (height, width)


def test_an_hdr_clip_s_frames_share_one_scaler_map(tmp_path, monkeypatch):
    """The scaler builds its HDR map in about 4 s and keeps it while the frames' size and
    colours stay the same: a clip's frames share one reformatter, so a clip costs one
    build, not one a frame (a 20-frame HLG clip of 64 x 4 took 40.7 s; 3.5 s now)."""
    import av

    from datacentric.data import media_display

    path = tmp_path / "hdr.mkv"
    _tagged_greys(path, 18, 9, np.linspace(0, 1, 8))
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
    with av.open(str(path), "w", format="matroska") as container:  # 3 frames of it
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = 8, 4, "yuv444p10le"
        for name in ("color_range", "colorspace", "color_trc", "color_primaries"):
            setattr(stream.codec_context, name, getattr(frame, name))
        for _ in range(3):
            frame.pts = None
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    used = []
    monkeypatch.setattr(media_display, "rgb_picture", lambda f, r: used.append(r) or f.to_image())
    assert len(decode(_item(path))) == 3
    assert len(used) == 3 and len({id(r) for r in used}) == 1


def _linear_light_profile() -> bytes:
    """A profile of sRGB's colorants (LittleCMS's own) and a gamma of 1 (linear light): a
    picture tagged with it holds light, not sRGB's levels, and viewers show level 128 as
    sRGB's 188."""
    import struct

    return rgb_profile(b"curv\0\0\0\0" + struct.pack(">IH", 1, 256) + b"\0\0")  # gamma 1.0


def _camera_srgb_profile() -> bytes:
    """An sRGB profile laid out as the one cameras and editors embed ('sRGB
    IEC61966-2.1'): sRGB's curve in a table of 1024 entries, colorants to 4 decimals."""
    colorants = [(0.4361, 0.2225, 0.0139), (0.3851, 0.7169, 0.0971), (0.1431, 0.0606, 0.7141)]
    return rgb_profile(srgb_curve(), colorants)


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".tiff", ".webp"])
def test_a_picture_with_a_colour_profile_is_shown_as_viewers_show_it(tmp_path, suffix):
    """A still, and an animated PNG's or WebP's frames, tagged with an ICC profile other
    than sRGB's are converted to sRGB by it, as viewers show them: a linear-light
    picture's levels come out sRGB-encoded (128 as 188). Its levels were taken as
    sRGB's: 51.7 levels off on average for this ramp."""
    from PIL import Image

    ramp = np.tile(np.linspace(0, 255, 48).round().astype(np.uint8), (32, 1))
    stored = np.stack([ramp, ramp[::-1], np.full_like(ramp, 128)], -1)
    path = tmp_path / f"linear{suffix}"
    options = {".jpg": {"quality": 100}, ".webp": {"lossless": True}}.get(suffix, {})
    Image.fromarray(stored).save(path, icc_profile=_linear_light_profile(), **options)
    light = stored / 255.0  # the sRGB encoding of linear light, by its formula
    want = np.where(light <= 0.0031308, 12.92 * light, 1.055 * light ** (1 / 2.4) - 0.055) * 255
    (got,) = decode(_item(path))
    tolerance = 3 if suffix == ".jpg" else 1  # JPEG's loss at quality 100
    assert _error(got, np.round(want)) < tolerance, (suffix, _error(got, stored))
    if suffix in (".png", ".webp"):  # an animation's frames: 64, 128, 192 as 137, 188, 225
        frames = [Image.fromarray(np.full((8, 8, 3), v, np.uint8)) for v in (64, 128, 192)]
        path = tmp_path / f"animated{suffix}"
        profile = _linear_light_profile()
        frames[0].save(path, save_all=True, append_images=frames[1:], icc_profile=profile)
        assert [np.asarray(f)[0, 0, 0] for f in decode(_item(path))] == [137, 188, 225]


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_a_photo_turned_by_exif_with_a_colour_profile_is_turned_and_converted(tmp_path, suffix):
    """A phone's portrait photo (EXIF orientation 6: turned 90 degrees clockwise to be
    shown) that also embeds a colour profile is shown upright and converted by it
    (regression case): the two are applied together, against numpy's turn and the
    sRGB encoding of linear light by its formula."""
    from PIL import Image

    ramp = np.tile(np.linspace(0, 255, 48).round().astype(np.uint8), (32, 1))
    stored = np.stack([ramp, ramp[::-1], np.full_like(ramp, 128)], -1)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / f"portrait{suffix}"
    options = {".jpg": {"quality": 100}}.get(suffix, {})
    Image.fromarray(stored).save(path, exif=exif, icc_profile=_linear_light_profile(), **options)
    light = np.rot90(stored, k=-1) / 255.0
    want = np.where(light <= 0.0031308, 12.92 * light, 1.055 * light ** (1 / 2.4) - 0.055) * 255
    info = probe(_item(path))
    (got,) = decode(_item(path))
    assert (info.height, info.width, info.rotated) == (48, 32, True)
    assert _error(got, np.round(want)) < (3 if suffix == ".jpg" else 1)


def test_a_profile_that_does_not_read_or_fit_is_passed_over_as_viewers_pass_it(tmp_path):
    """A PNG whose ICC profile is damaged, and a greyscale PNG given an RGB profile: their
    levels are shown as sRGB's, as viewers show them (no error, no other colours)."""
    from PIL import Image

    stored = wave_frames(1, 32, 48)[0]
    damaged = _linear_light_profile()[:200]
    Image.fromarray(stored).save(tmp_path / "damaged.png", icc_profile=damaged)
    grey = stored[..., 0]
    Image.fromarray(grey).save(tmp_path / "grey.png", icc_profile=_linear_light_profile())
    (got,) = decode(_item(tmp_path / "damaged.png"))
    assert np.array_equal(np.asarray(got), stored)
    (got,) = decode(_item(tmp_path / "grey.png"))
    assert np.array_equal(np.asarray(got), np.stack([grey] * 3, -1))


def test_a_picture_tagged_srgb_is_read_as_stored_without_a_conversion(tmp_path, monkeypatch):
    """Photos tagged with an sRGB profile (LittleCMS's own, and one laid out as cameras
    write it), as most photos are: read at their levels exactly, and no picture goes
    through LittleCMS (a profile is checked once, on a sample of colours). Each picture
    was converted: about 12 ms a 1024 x 768 photo, 4 times its JPEG decoding."""
    from PIL import Image, ImageCms

    converted = []
    convert = ImageCms.profileToProfile
    monkeypatch.setattr(
        ImageCms,
        "profileToProfile",
        lambda im, *a, **k: converted.append(im.size) or convert(im, *a, **k),
    )
    stored = wave_frames(1, 32, 48)[0]
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    for number in range(4):
        profile = (srgb, _camera_srgb_profile())[number % 2]
        path = tmp_path / f"photo{number}.png"
        Image.fromarray(stored).save(path, icc_profile=profile)
        (got,) = decode(_item(path))
        assert np.array_equal(np.asarray(got), stored), number
    assert (48, 32) not in converted, converted


def test_an_avi_with_gaps_in_its_frame_times_has_the_frames_that_decode(tmp_path):
    """An AVI of 9 pictures over 21 frame slots (a capture that dropped frames, or any
    variable-rate clip written to AVI): its header states the 21 slots, players hold a
    picture over a gap. probe said 21 and decode failed 'only 9 frames decode, 21
    wanted (a truncated or damaged stream)', so prepare skipped the clip; now the 9
    pictures are its frames, timed by their timestamps for --target-fps."""
    from fractions import Fraction

    import av

    ticks = [0, 1, 2, 5, 6, 10, 11, 12, 20]  # eighths of a second
    path = tmp_path / "gaps.avi"
    written = _write_timed(path, "avi", "ffv1", ticks)
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == 21  # the slots the header states
    item = _item(path)
    assert probe(item).frames == 9
    assert probe(item, times=True).times == tuple(Fraction(t, 8) for t in ticks)
    got = decode(item, list(range(9)))
    assert all(_error(g, w) < 1 for g, w in zip(got, written))


def _interlaced_clip(path: Path, frames: int, height: int = 64, width: int = 96) -> None:
    """A clip filmed interlaced: each frame's top field (even lines) from one instant and
    its bottom field from the next, a bar moving 6 pixels a field, stored losslessly by
    H.264 coded interlaced, top field first."""
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {
            "qp": "0",
            "preset": "ultrafast",
            "flags": "+ildct+ilme",
            "x264-params": "interlaced=1:tff=1",
        }
        for number in range(frames):
            pixels = np.full((height, width, 3), 40, dtype=np.uint8)
            for field in (0, 1):
                x = (12 * number + 6 * field) % (width - 16)
                pixels[8 + field : height - 8 : 2, x : x + 16] = (230, 200, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _bwdif_frames(path: Path) -> tuple[list, list]:
    """The clip's frames as decoded (woven) and through FFmpeg's bwdif filter, one frame
    per frame (as players show them), both as RGB arrays."""
    import av
    import av.filter

    woven, shown = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        graph = av.filter.Graph()
        source = graph.add_buffer(template=stream.codec_context, time_base=stream.time_base)
        bwdif = graph.add("bwdif", "mode=send_frame:parity=auto")
        sink = graph.add("buffersink")
        source.link_to(bwdif)
        bwdif.link_to(sink)
        graph.configure()
        decoded = list(container.decode(stream))
        for frame in [*decoded, None]:
            graph.vpush(frame)
            while True:
                try:
                    shown.append(graph.vpull().to_ndarray(format="rgb24"))
                except (av.BlockingIOError, av.EOFError):
                    break
        woven = [frame.to_ndarray(format="rgb24") for frame in decoded]
    return woven, shown


def test_an_interlaced_clip_is_deinterlaced_as_players_show_it(tmp_path):
    """A clip filmed interlaced (its frames say so, top field first) decodes to the frames
    FFmpeg's deinterlacer gives one per frame, as mpv, VLC and browsers show it: it
    decoded to woven frames, each moving edge combed by lines from two instants. The
    frame count and times are the clip's."""
    path = tmp_path / "interlaced.mkv"
    _interlaced_clip(path, 12)
    woven, shown = _bwdif_frames(path)
    assert len(shown) == len(woven) == 12
    item = _item(path)
    assert probe(item).frames == 12
    got = decode(item)
    assert len(got) == 12
    assert max(_error(w, s) for w, s in zip(woven, shown)) > 3  # the combs bwdif fills
    assert all(_error(g, s) < 0.5 for g, s in zip(got, shown))
    assert np.array_equal(np.asarray(decode(item, [5])[0]), np.asarray(got[5]))


def _not_coded_avi(path: Path, source: Path, dropped: tuple[int, ...]) -> int:
    """``source``'s MPEG-4 AVI written again with a VOP "not coded" (a 6-byte packet, as
    Xvid writes a dropped frame: P, time increment 1 of 3 bits, vop_coded 0) after each
    packet of ``dropped``; the packets written."""
    from fractions import Fraction

    import av

    not_coded = bytes([0, 0, 1, 0xB6, 0x53, 0x3F])
    with av.open(str(source)) as container:
        stream = container.streams.video[0]
        width, height = stream.width, stream.height
        extradata = stream.codec_context.extradata
        coded = [(bytes(p), p.is_keyframe) for p in container.demux(stream) if p.size]
    chunks = []
    for number, chunk in enumerate(coded):
        chunks += [chunk, (not_coded, False)] if number in dropped else [chunk]
    with av.open(str(path), "w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.extradata = extradata
        for tick, (data, keyframe) in enumerate(chunks):
            packet = av.Packet(data)
            packet.pts = packet.dts = tick
            packet.time_base, packet.stream = Fraction(1, 8), stream
            packet.is_keyframe = keyframe
            container.mux(packet)
    return len(chunks)


def test_an_avi_of_an_intra_only_codec_is_probed_without_decoding_its_frames(tmp_path, monkeypatch):
    """An AVI's header counts frame slots, so probe counted its pictures by decoding
    them all (a long AVI decoded twice: to probe and to encode). Of an intra-only codec
    (MJPEG, as cameras record AVI; raw), each packet that holds data is a picture: probe
    counts them and decodes one frame. An MPEG-4 AVI is still decoded to count: a VOP
    "not coded" (a dropped frame) is a packet that decodes to no frame."""
    from datacentric.data import media_decode

    decoded = []

    class Counted(media_decode._Frames):
        def __iter__(self):
            for frame in super().__iter__():
                decoded.append(frame)
                yield frame

    monkeypatch.setattr(media_decode, "_Frames", Counted)
    ticks = [0, 1, 2, 5, 6, 10, 11, 12, 20]  # 9 pictures over 21 slots
    pixels = {"mjpeg": "yuvj420p", "rawvideo": "yuv420p", "ffv1": "yuv444p"}
    for codec in ("mjpeg", "rawvideo", "ffv1", "mpeg4", "libx264"):
        path = tmp_path / f"{codec}.avi"
        _write_timed(path, "avi", codec, ticks, pixels.get(codec, "yuv420p"))
        decoded.clear()
        assert probe(_item(path)).frames == 9, codec
        assert len(decoded) == (1 if codec in ("mjpeg", "rawvideo") else 9), codec
        assert len(decode(_item(path))) == 9, codec
    dropped = tmp_path / "dropped.avi"
    assert _not_coded_avi(dropped, tmp_path / "mpeg4.avi", (2, 5)) == 11  # packets
    assert probe(_item(dropped)).frames == len(decode(_item(dropped))) == 9
