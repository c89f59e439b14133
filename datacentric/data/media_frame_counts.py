"""How many frames a clip plays, and when, for :mod:`datacentric.data.media_decode`'s
``probe``: its stream's own count where the container states the frames that play
(:func:`_stated_frames`), else its packets' where they tell the frames they show without
decoding (:func:`_demuxed_pictures`), else the frames that decode. Matroska and WebM state
none; an AVI states its frame slots (:data:`SLOT_COUNTS`), a picture held over a gap
counted again; an IVF the frames it stores (:data:`STORED_COUNTS`), a hidden one
counted; an MP4 or MOV whose edit list trims frames states more than play. Each frame's
time is its timestamp (:func:`_frame_time`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

#: containers whose stated frame count is their frame slots, not their pictures: an
#: AVI's header counts every slot of its frame rate, a picture held over a gap (a
#: dropped frame, a variable rate) counted again
SLOT_COUNTS = ("avi",)
#: containers whose stated frame count is the frames they store, not those that show:
#: an IVF's header counts a VP8 alt-ref stored as a frame of its own (as FFmpeg's IVF
#: muxer writes a WebM's copied), which decodes to no frame; their packets are counted
#: where they tell the frames that show (:data:`PACKET_COUNTS`), an AV1 IVF's header
#: (one frame shown a temporal unit) is its count
STORED_COUNTS = ("ivf",)


def _one_picture(data: memoryview) -> int | None:
    """A packet of FFV1 or an intra-only codec of :data:`ONE_PICTURE_CODECS`: one
    picture (their FFmpeg decoders give a frame for every packet that holds data, or
    fail on it)."""
    return 1


def _vp8_shown(data: memoryview) -> int | None:
    """A VP8 packet's shown frames: 1 where its frame tag's ``show_frame`` bit (bit 4 of
    its first byte, RFC 6386 9.1) is set, 0 for an invisible frame (an alt-ref stored as
    a block of its own, which FFmpeg's decoder decodes and never outputs); None for a
    packet too short to hold a tag."""
    return (1 if data[0] & 0x10 else 0) if len(data) >= 3 else None


def _vp9_frames(data: memoryview) -> list[memoryview] | None:
    """A VP9 packet's frames, as FFmpeg's decoder splits them (``vp9_superframe_split``):
    a superframe's, by the index at its end (a marker byte ``110mmnnn``, ``nnn + 1``
    sizes of ``mm + 1`` bytes little-endian, the marker again), else the packet; None
    where the index's sizes do not fit the packet."""
    marker = data[-1]
    if marker & 0xE0 != 0xC0:
        return [data]
    length, count = 1 + (marker >> 3 & 3), 1 + (marker & 7)
    index = 2 + count * length
    if len(data) < index or data[len(data) - index] != marker:
        return [data]
    sizes = bytes(data[len(data) - index + 1 : len(data) - 1])
    frames, start = [], 0
    for number in range(count):
        size = int.from_bytes(sizes[number * length : (number + 1) * length], "little")
        if size <= 0 or start + size > len(data) - index:
            return None
        frames.append(data[start : start + size])
        start += size
    return frames


def _vp9_shown(data: memoryview) -> int | None:
    """A VP9 packet's shown frames: of each of its frames (:func:`_vp9_frames`), one
    whose uncompressed header (VP9 bitstream 6.2) says ``show_existing_frame`` (a frame
    decoded before, shown now) or ``show_frame``; a hidden frame (an alt-ref) shows
    none. None where a frame holds no VP9 header, or one FFmpeg's decoder refuses: a
    profile 3 header's reserved bit set (read as profile 4)."""
    frames = _vp9_frames(data)
    if frames is None:
        return None
    shown = 0
    for frame in frames:
        bits = int.from_bytes(bytes(frame[:2]).ljust(2, b"\0"), "big")
        if not frame or bits >> 14 != 2:  # frame_marker
            return None
        profile_3 = (bits >> 12 & 3) == 3  # its profile bits, low then high
        if profile_3 and bits >> 11 & 1:  # reserved_zero set
            return None
        at = 10 if profile_3 else 11  # past profile 3's reserved bit
        existing, shows = bits >> at & 1, bits >> (at - 2) & 1
        shown += 1 if existing or shows else 0
    return shown


#: intra-only decoders (FFmpeg's names) that give one frame for every packet holding
#: data, or fail on it: MJPEG (an interlaced picture's two fields in one packet), DV,
#: raw, HuffYUV, Ut Video, MagicYUV, ProRes, DNxHD, 10-bit 4:2:2 (v210). Not every
#: codec FFmpeg calls intra-only (each picture whole) is so: Fraps stores a frame that
#: repeats the one before as a header that decodes to no frame; it and the codecs not
#: named here are decoded to count.
ONE_PICTURE_CODECS = (
    *("mjpeg", "dvvideo", "rawvideo", "huffyuv", "ffvhuff", "utvideo", "magicyuv"),
    *("prores", "dnxhd", "v210"),
)

#: decoders (FFmpeg's names) whose packets tell the frames they show, each packet's told
#: by its function: FFV1's and :data:`ONE_PICTURE_CODECS`' one picture a packet, VP8's
#: and VP9's frame headers' show flags. H.264 and H.265 are decoded to count (a packet
#: may hold a lone field, and the decoder drops frames it cannot reorder); MPEG-4 Part 2
#: (a VOP "not coded", a packed B-frame) and AV1 too.
PACKET_COUNTS: dict[str, Callable[[memoryview], int | None]] = {
    "ffv1": _one_picture,
    **dict.fromkeys(ONE_PICTURE_CODECS, _one_picture),
    "vp8": _vp8_shown,
    "vp9": _vp9_shown,
}


def _demuxed_pictures(container: Any, stream: Any) -> int:
    """The frames a stream shows told from its packets without decoding them: of FFV1
    and the intra-only codecs of :data:`ONE_PICTURE_CODECS` (MJPEG, DV, raw, HuffYUV,
    Ut Video, ProRes), its packets that hold data; of VP8 and VP9, the frames their
    headers show (:data:`PACKET_COUNTS`). 0 (decode them to count) for another codec, or
    a packet that does not tell them: an MPEG-4 Part 2 packet (Xvid, DivX) may hold a
    VOP "not coded" (a dropped frame, 6 bytes), which decodes to no frame, a Fraps one
    a frame repeated, and an H.264 one a lone field."""
    import av

    shown = PACKET_COUNTS.get(str(stream.codec_context.codec.name))
    if shown is None:
        return 0
    total = 0
    with av.open(container.name) as again:
        for packet in again.demux(again.streams[stream.index]):
            if packet.is_corrupt:  # cut short (a truncated file): may decode to none
                return 0
            count = shown(memoryview(packet)) if packet.size else 0
            if count is None:
                return 0
            total += count
    return total


def _stated_frames(stream: Any, container: Any) -> int:
    """The frames a video stream's container states, where they are the frames that play;
    else those its packets tell (:func:`_demuxed_pictures`) where it states none, counts
    frame slots (:data:`SLOT_COUNTS`) or counts the frames it stores of a codec whose
    packets tell those that show (:data:`STORED_COUNTS`); 0 (count them as they decode)
    where neither does, or where it states more than its duration holds at its frame
    rate: an MP4 or MOV cut without re-encoding, whose edit list trims frames that FFmpeg
    (and every player) then never shows."""
    stated = int(stream.frames or 0)
    kind = str(getattr(container.format, "name", ""))
    told = str(stream.codec_context.codec.name) in PACKET_COUNTS
    if not stated or kind in SLOT_COUNTS or (kind in STORED_COUNTS and told):
        return _demuxed_pictures(container, stream)
    duration, base, rate = stream.duration, stream.time_base, stream.average_rate
    if stated and duration and base and rate and stated > round(duration * base * rate):
        return 0
    return stated


def _frame_time(frame: Any, number: int, stream: Any) -> Any:
    """A decoded frame's timestamp in seconds: exact (``Fraction``) from its ``pts``, or
    its number over the stream's frame rate when it has none."""
    if frame.pts is not None and frame.time_base is not None:
        return frame.pts * frame.time_base
    rate = stream.average_rate or stream.guessed_rate or 1
    return Fraction(number) / Fraction(rate)
