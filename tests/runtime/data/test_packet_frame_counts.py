"""A clip whose container states no frame count (Matroska, WebM, Ogg, IVF) or counts
frame slots (AVI) is counted from its packets without decoding them where they tell the
frames that show (FFV1, VP8, VP9, intra-only codecs), and by decoding otherwise: on every
clip kind the media tests write, the count probe gives is the frames that decode, and
probe decodes one frame where packets count. Each clip is written with PyAV (the
decoder's own library)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from fidelity_clips import _item, count_decoded
from media_formats import FORMATS, SUFFIX_FORMATS, write_format_clip

from datacentric.data import media_decode
from datacentric.data.media_frame_counts import (
    ONE_PICTURE_CODECS,
    PACKET_COUNTS,
    _demuxed_pictures,
)

pytest.importorskip("av")

#: every clip kind the media tests write (H.265 apart: written in a child process), by
#: file name; an FFV1 AVI and an FFV1 MKV in 4:2:0 beside the formats' own
KINDS = {
    **{name: spec for name, spec in FORMATS.items()},
    **{f"clip{suffix}": spec for suffix, spec in SUFFIX_FORMATS.items()},
    "ffv1.avi": ("ffv1", "avi", "yuv420p", False),
    "ffv1_420.mkv": ("ffv1", "matroska", "yuv420p", False),
    "vp9.mkv": ("libvpx-vp9", "matroska", "yuv420p", False),
}
#: the codecs whose packets tell the frames that show
COUNTED = {*PACKET_COUNTS, "mjpeg", "rawvideo"}


@pytest.fixture
def decoded(monkeypatch) -> list:
    """The frames probe and decode take from their decoder, listed."""
    return count_decoded(monkeypatch)


def _decoded_count(path: Path) -> int:
    """The frames a clip decodes to, every packet decoded (as probe counted them before)."""
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(container.streams.video[0]))


def _probed(path: Path, decoded: list) -> tuple[int, int]:
    """probe's frame count and the frames it decoded to give it."""
    decoded.clear()
    frames = media_decode.probe(_item(path)).frames
    return frames, len(decoded)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_clip_kind_is_counted_as_it_decodes(tmp_path, decoded, name):
    """The count probe gives equals the frames that decode; where the container states
    none or counts slots and the codec's packets tell the frames, the packets give it
    and probe decodes the first frame only (a 10 s 480p WebM or MKV was decoded whole to
    probe it, then again to prepare it)."""
    import av

    path = write_format_clip(tmp_path / name, 11, 32, 48, rate=25, spec=KINDS[name])
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        codec, stated = stream.codec_context.codec.name, stream.frames
        counted = _demuxed_pictures(container, stream)
    want = _decoded_count(path)
    assert want == 11, name
    frames, decodes = _probed(path, decoded)
    assert frames == want, name
    if codec in COUNTED and (not stated or KINDS[name][1] in ("avi", "ivf")):
        assert counted == want and decodes == 1, (name, counted, decodes)
    else:
        assert counted in (0, want), (name, counted)


def _remuxed(path: Path, source: Path, packets: list[bytes]) -> Path:
    """``source``'s video stream written to ``path`` (its container) with ``packets`` for
    its own, one a tick, the first a keyframe."""
    import av

    with av.open(str(source)) as container:
        template = container.streams.video[0]
        with av.open(str(path), "w", format=container.format.name.split(",")[0]) as out:
            stream = out.add_stream_from_template(template)
            for tick, data in enumerate(packets):
                packet = av.Packet(data)
                packet.pts = packet.dts = tick
                packet.time_base, packet.stream = Fraction(1, 8), stream
                packet.is_keyframe = tick == 0
                out.mux(packet)
    return path


def _packets(path: Path) -> list[bytes]:
    import av

    with av.open(str(path)) as container:
        return [bytes(p) for p in container.demux(container.streams.video[0]) if p.size]


def test_a_vp8_alt_ref_stored_as_its_own_block_is_no_frame(tmp_path, decoded):
    """A VP8 alt-ref (an invisible frame: its tag's show_frame bit clear) stored as a
    block of its own decodes to no frame: the packets tell 8 frames of 9, as decode."""
    source = write_format_clip(tmp_path / "vp8.webm", 9, 32, 48)
    packets = _packets(source)
    hidden = bytes([packets[3][0] & ~0x10]) + packets[3][1:]
    path = _remuxed(tmp_path / "altref.webm", source, [*packets[:3], hidden, *packets[4:]])
    assert _decoded_count(path) == 8
    assert _probed(path, decoded) == (8, 1)
    assert len(media_decode.decode(_item(path))) == 8


def test_an_ivf_header_counts_a_vp8_alt_ref_that_is_no_frame(tmp_path, decoded):
    """An IVF's header counts the frames it stores, which FFmpeg gives as the stream's
    count: a VP8 alt-ref stored as a frame of its own among them (as FFmpeg's IVF muxer
    writes a WebM's copied) is counted there but decodes to no frame. Its packets are
    counted (8 of 9), as decode gives, not its header (9); an AV1 IVF's header, one
    frame shown a temporal unit, is still its count."""
    import av

    spec = ("libvpx", "ivf", "yuv420p", False)
    source = write_format_clip(tmp_path / "vp8.ivf", 9, 32, 48, spec=spec)
    packets = _packets(source)
    hidden = bytes([packets[3][0] & ~0x10]) + packets[3][1:]
    path = _remuxed(tmp_path / "altref.ivf", source, [*packets[:3], hidden, *packets[4:]])
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == 9
    assert _decoded_count(path) == 8
    assert _probed(path, decoded) == (8, 1)
    assert len(media_decode.decode(_item(path))) == 8
    av1 = ("libsvtav1", "ivf", "yuv420p", False)
    path = write_format_clip(tmp_path / "av1.ivf", 9, 64, 64, spec=av1)
    assert _probed(path, decoded) == (9, 1)


def _superframe(*frames: bytes) -> bytes:
    """VP9 frames in one packet: a superframe, its index of 4-byte sizes at its end."""
    marker = bytes([0xC0 | 3 << 3 | len(frames) - 1])
    sizes = b"".join(len(frame).to_bytes(4, "little") for frame in frames)
    return b"".join(frames) + marker + sizes + marker


def test_vp9_hidden_frames_and_frames_shown_again_are_counted_as_they_decode(tmp_path, decoded):
    """VP9's packets as encoders write an alt-ref: a hidden frame (show_frame clear)
    alone, one in a superframe with the frame shown after it, and a frame shown again
    (show_existing_frame, one byte): their headers tell the 10 frames that decode of 11
    packets holding 12 frames. The hidden frame is the keyframe again, whose header
    holds nothing more when hidden."""
    source = write_format_clip(tmp_path / "vp9.webm", 9, 32, 48)
    packets = _packets(source)
    assert packets[0][0] == 0b1000_0010  # frame marker, profile 0, a keyframe shown
    assert all(p[0] >> 3 == 0b1000_0 for p in packets)  # none shown again
    hidden = bytes([packets[0][0] & ~0x02]) + packets[0][1:]
    shown_again = bytes([0b1000_1000])  # frame marker, profile 0, show_existing_frame, slot 0
    remade = [
        *packets[:3],
        hidden,
        packets[3],
        _superframe(hidden, packets[4]),
        packets[5],
        shown_again,
        *packets[6:],
    ]
    path = _remuxed(tmp_path / "hidden.webm", source, remade)
    assert _decoded_count(path) == 10
    assert _probed(path, decoded) == (10, 1)
    assert len(media_decode.decode(_item(path))) == 10


def test_a_vp9_profile_3_header_is_read_past_its_reserved_bit(tmp_path, decoded):
    """A profile 3 frame's header holds a reserved bit before show_existing_frame (VP9
    bitstream 6.2): a frame shown again written in profile 3 (two bytes) is read past
    it and counted, as it decodes (10 frames). With that bit set FFmpeg's decoder
    refuses the frame (profile 4), so the header does not tell: probe decodes the
    clip to count it and says it cannot be read, as decode would fail on that frame."""
    source = write_format_clip(tmp_path / "vp9.webm", 9, 32, 48)
    packets = _packets(source)
    for reserved in (0, 1):
        # frame marker, profile bits 1 1, the reserved bit, show_existing_frame, slot 0
        shown_again = bytes([0b1011_0100 | reserved << 3, 0])
        path = _remuxed(
            tmp_path / f"p3_{reserved}.webm", source, [*packets[:4], shown_again, *packets[4:]]
        )
        if not reserved:
            assert _decoded_count(path) == 10
            assert _probed(path, decoded) == (10, 1)
            continue
        with pytest.raises(media_decode.MediaError, match="corrupt or unreadable"):
            media_decode.probe(_item(path))
        with pytest.raises(media_decode.MediaError, match="corrupt video"):
            media_decode.decode(_item(path))


def test_an_avi_cut_short_is_counted_by_decoding(tmp_path, decoded):
    """An AVI cut off inside its last packet (a copy that stopped): the demuxer gives
    that packet short, marked corrupt, and it decodes to no frame, so probe decodes
    the clip to count it (its packets said 9, and decode then failed)."""
    source = write_format_clip(tmp_path / "ffv1.avi", 9, 32, 48, spec=KINDS["ffv1.avi"])
    assert _probed(source, decoded) == (9, 1)
    data = source.read_bytes()
    last = _packets(source)[-1]
    end = data.rindex(last) + len(last)
    path = tmp_path / "cut.avi"
    path.write_bytes(data[: end - len(last) // 2])
    assert _probed(path, decoded) == (8, 8)
    assert len(media_decode.decode(_item(path))) == 8


def _fraps_avi(path: Path, packets: list[bytes], width: int, height: int) -> Path:
    """An AVI of Fraps packets (FourCC ``FPS1``), one a tick: written as raw BGR24 by
    PyAV, which has no Fraps encoder, its stream header and format then marked Fraps."""
    import av

    with av.open(str(path), "w", format="avi") as out:
        stream = out.add_stream("rawvideo", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "bgr24"
        for tick, data in enumerate(packets):
            packet = av.Packet(data)
            packet.pts = packet.dts = tick
            packet.time_base, packet.stream = Fraction(1, 25), stream
            packet.is_keyframe = True
            out.mux(packet)
    data = bytearray(path.read_bytes())
    handler = data.index(b"strh") + 12  # the chunk's id and size, fccType, fccHandler
    compression = data.index(b"strf") + 24  # BITMAPINFOHEADER's biCompression
    data[handler : handler + 4] = data[compression : compression + 4] = b"FPS1"
    path.write_bytes(bytes(data))
    return path


def test_a_fraps_frame_that_repeats_the_one_before_is_no_frame(tmp_path, decoded):
    """Fraps (an intra-only codec by FFmpeg's list: each picture it gives is whole)
    stores a frame that repeats the one before as a header alone, its bit 31 set, which
    FFmpeg's decoder decodes to no frame: a Fraps AVI of 6 packets, 3 of them such, is
    counted at the 3 frames that decode, by decoding them (its packets said 6, and
    decode then failed past the third)."""
    width, height = 32, 16
    picture = bytes(range(256)) * (width * height * 3 // 256)
    shown = (1).to_bytes(4, "little") + picture  # version 1: BGR24, bottom row first
    repeated = (1 | 1 << 31).to_bytes(4, "little")
    packets = [shown, repeated, repeated, shown, repeated, shown]
    path = _fraps_avi(tmp_path / "fraps.avi", packets, width, height)
    assert _decoded_count(path) == 3
    assert _probed(path, decoded) == (3, 3)
    assert len(media_decode.decode(_item(path))) == 3


#: a clip of each codec of ONE_PICTURE_CODECS, by its decoder: encoder, container,
#: pixel format, height and width (DV at its PAL size, DNxHD as DNxHR in MXF, which
#: states no count)
ONE_PICTURE_CLIPS = {
    "mjpeg": ("mjpeg", "avi", "yuvj420p", 32, 48),
    "dvvideo": ("dvvideo", "avi", "yuv420p", 576, 720),
    "rawvideo": ("rawvideo", "matroska", "yuv420p", 32, 48),
    "huffyuv": ("huffyuv", "avi", "yuv422p", 32, 48),
    "ffvhuff": ("ffvhuff", "avi", "yuv420p", 32, 48),
    "utvideo": ("utvideo", "avi", "yuv420p", 32, 48),
    "magicyuv": ("magicyuv", "avi", "yuv420p", 32, 48),
    "prores": ("prores_ks", "matroska", "yuv422p10le", 32, 48),
    "dnxhd": ("dnxhd", "mxf", "yuv422p", 128, 256),
    "v210": ("v210", "avi", "yuv422p10le", 32, 48),
}


@pytest.mark.parametrize("codec", sorted(ONE_PICTURE_CLIPS))
def test_each_codec_counted_a_picture_a_packet_is(tmp_path, decoded, monkeypatch, codec):
    """Each codec whose packets are counted one picture each is so as written: probe
    gives the 5 frames that decode and decodes one; every one of them is written here."""
    import av
    import media_formats

    assert set(ONE_PICTURE_CLIPS) == set(ONE_PICTURE_CODECS)
    monkeypatch.setitem(media_formats.OPTIONS, "dnxhd", {"profile": "dnxhr_lb"})
    encoder, fmt, pix, height, width = ONE_PICTURE_CLIPS[codec]
    spec = (encoder, fmt, pix, False)
    path = write_format_clip(tmp_path / f"{codec}.{fmt}", 5, height, width, rate=25, spec=spec)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.codec.name == codec
        assert stream.frames in (0, 5)  # none stated, or AVI's slots
    assert _decoded_count(path) == 5
    assert _probed(path, decoded) == (5, 1)
