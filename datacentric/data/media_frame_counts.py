"""How many frames a clip plays, and when, for :mod:`datacentric.data.media_decode`'s
``probe``: its stream's own count where the container states the frames that play
(:func:`_stated_frames`), else the frames that decode. Matroska and WebM state none; an
AVI states its frame slots (:data:`SLOT_COUNTS`), a picture held over a gap counted
again, so its packets tell an intra-only codec's pictures (:func:`_demuxed_pictures`);
an MP4 or MOV whose edit list trims frames states more than play. Each frame's time is
its timestamp (:func:`_frame_time`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

#: containers whose stated frame count is their frame slots, not their pictures: an
#: AVI's header counts every slot of its frame rate, a picture held over a gap (a
#: dropped frame, a variable rate) counted again
SLOT_COUNTS = ("avi",)


def _demuxed_pictures(container: Any, stream: Any) -> int:
    """The pictures of a slot-counting stream (:data:`SLOT_COUNTS`) told without decoding
    them: its packets that hold data, for an intra-only codec (MJPEG, DV, raw, HuffYUV,
    Ut Video, ProRes), where each such packet is one picture; 0 (decode them to count)
    for another: an MPEG-4 Part 2 packet (Xvid, DivX) may hold a VOP "not coded" (a
    dropped frame, 6 bytes), which decodes to no frame, and an H.264 one a lone field."""
    import av

    if not getattr(stream.codec_context.codec, "intra_only", False):
        return 0
    with av.open(container.name) as again:
        packets = again.demux(again.streams[stream.index])
        return sum(1 for packet in packets if packet.size)


def _stated_frames(stream: Any, container: Any) -> int:
    """The frames a video stream's container states, where they are the frames that play;
    0 (count them as they decode) where it states none, where it counts frame slots
    (:data:`SLOT_COUNTS`) of a codec whose packets do not tell its pictures
    (:func:`_demuxed_pictures`), or more than its duration holds at its frame rate: an
    MP4 or MOV cut without re-encoding, whose edit list trims frames that FFmpeg (and
    every player) then never shows."""
    if str(getattr(container.format, "name", "")) in SLOT_COUNTS:
        return _demuxed_pictures(container, stream)
    stated = int(stream.frames or 0)
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
