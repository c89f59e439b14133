"""A clip's frame count and times reach ``prepare`` as a player plays them: an AVI's
pictures, not the frame slots its header states (counted from its packets without
decoding for an intra-only codec), and uneven frame times resampled by their
timestamps. Each clip is written with PyAV (the decoder's own library), losslessly
where the codec allows."""

from __future__ import annotations

from pathlib import Path

import pytest
from fidelity_clips import H264_GOP4, _error, _item, count_decoded
from media_formats import wave_frames

from datacentric.data.media_decode import decode, probe

pytest.importorskip("av")


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
    (MJPEG, as cameras record AVI; raw) or FFV1, each packet that holds data is a
    picture: probe counts them and decodes one frame. An MPEG-4 AVI is still decoded to
    count: a VOP "not coded" (a dropped frame) is a packet that decodes to no frame."""
    decoded = count_decoded(monkeypatch)
    ticks = [0, 1, 2, 5, 6, 10, 11, 12, 20]  # 9 pictures over 21 slots
    pixels = {"mjpeg": "yuvj420p", "rawvideo": "yuv420p", "ffv1": "yuv444p"}
    for codec in ("mjpeg", "rawvideo", "ffv1", "mpeg4", "libx264"):
        path = tmp_path / f"{codec}.avi"
        _write_timed(path, "avi", codec, ticks, pixels.get(codec, "yuv420p"))
        decoded.clear()
        assert probe(_item(path)).frames == 9, codec
        assert len(decoded) == (1 if codec in ("mjpeg", "rawvideo", "ffv1") else 9), codec
        assert len(decode(_item(path))) == 9, codec
    dropped = tmp_path / "dropped.avi"
    assert _not_coded_avi(dropped, tmp_path / "mpeg4.avi", (2, 5)) == 11  # packets
    assert probe(_item(dropped)).frames == len(decode(_item(dropped))) == 9
