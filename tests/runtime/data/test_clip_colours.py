"""A clip's colours reach ``prepare`` as a player shows them: by the file's own colour
matrix and range (or the one players guess when it states none), HDR mapped to an
ordinary display, levels of more than 8 bits, colours under an alpha channel; a PyAV
that would show other colours is named. Each clip is written with PyAV (the decoder's
own library), losslessly where the codec allows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fidelity_clips import _error, _item
from media_formats import wave_frames

from datacentric.data.media_decode import decode, probe

pytest.importorskip("av")


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
