"""How ``datacentric prepare`` opens a video and which of its frames play, for
:mod:`datacentric.data.media_decode`: with PyAV (``av``, in the ``video`` extra), every
container and codec the installed PyAV decodes, from the video stream players open (the
default one, else the first; never a cover picture: :func:`_shown_stream`); audio and
other streams are never decoded.

- A PyAV that would not show a clip's colours (earlier than 17) is named as the reason
  no clip is read (:func:`_open_video`).
- A clip cut before its first keyframe plays from that keyframe, as players show it
  (:class:`_Frames`).
- An interlaced clip is deinterlaced as players show it (FFmpeg's ``bwdif``, one frame
  per frame: :func:`_deinterlaced`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datacentric.data.media_colours import colour_problem
from datacentric.data.media_info import MediaError

#: FFmpeg's stream dispositions read here (``AV_DISPOSITION_*``)
DEFAULT_STREAM, COVER_PICTURE = 0x1, 0x400


def _disposition(stream: Any) -> int:
    """A stream's FFmpeg disposition flags (0 where this PyAV reads none; PyAV 16 and 17
    give a ``Flag`` of no ``int()``)."""
    flags = getattr(stream, "disposition", 0)
    return int(getattr(flags, "value", flags) or 0)


def _shown_stream(streams: Any) -> Any:
    """The video stream a player opens of a file's: the first marked the default (as
    FFmpeg's own choice, ``av_find_best_stream``, prefers it), else the first; never a
    cover picture (an audio file's artwork: one still, no clip); None when there is
    no other."""
    moving = [s for s in streams if not _disposition(s) & COVER_PICTURE]
    if not moving:
        return None
    return next((s for s in moving if _disposition(s) & DEFAULT_STREAM), moving[0])


def _open_video(path: Path) -> Any:
    """A PyAV container and the video stream it shows (:func:`_shown_stream`; audio and
    other streams, wherever they sit, are never decoded); :class:`MediaError` when there
    is no video stream but a cover picture, or the installed PyAV would not show its
    colours (:func:`~datacentric.data.media_colours.colour_problem`)."""
    import av

    problem = colour_problem(str(av.__version__))
    if problem:
        raise MediaError(problem)
    container = av.open(str(path))
    stream = _shown_stream(container.streams.video)
    if stream is None:
        kinds = sorted({s.type for s in container.streams if s.type != "video"}) or ["no"]
        cover = " and a cover picture" if container.streams.video else ""
        container.close()
        raise MediaError(f"no video stream ({', '.join(kinds)} streams{cover} only)")
    stream.thread_type = "AUTO"
    return container, stream


class _Frames:
    """The decoded frames of a video stream as players show them, in presentation
    order. A stream cut before its first keyframe (a clip cut from a longer one without
    re-encoding) plays from that keyframe: the packets before its first frame that the
    decoder refuses (VP9 does; H.264 drops their frames itself) are passed over, as
    players pass them; any other refusal is the file's error."""

    def __init__(self, container: Any, stream: Any) -> None:
        self.container, self.stream = container, stream
        self.cut = False
        """The stream's first packet is no keyframe: the frames its container states
        count frames before the first keyframe, which never show."""

    def __iter__(self) -> Iterator[Any]:
        import av

        opened, shown = False, False  # the first packet seen; a frame decoded
        for packet in self.container.demux(self.stream):
            if not opened and packet.size:
                opened, self.cut = True, not packet.is_keyframe
            try:
                for frame in packet.decode():
                    shown = True
                    yield frame
            except av.error.FFmpegError:
                if shown or not self.cut:
                    raise


#: a stream's field orders that are interlaced (FFmpeg's ``AVFieldOrder``: TT, BB, TB, BT)
INTERLACED_ORDERS = (2, 3, 4, 5)
#: FFmpeg's deinterlacer, as players show an interlaced clip: one frame per frame, at the
#: clip's rate, by its field order; only frames that say they are interlaced
DEINTERLACER = ("bwdif", "mode=send_frame:parity=auto:deint=interlaced")


def _pulled(graph: Any) -> Iterator[Any]:
    """The frames a filter graph holds ready."""
    import av

    while True:
        try:
            yield graph.vpull()
        except (av.BlockingIOError, av.EOFError):
            return


def _deinterlaced(frames: Iterator[Any], stream: Any) -> Iterator[Any]:
    """A stream's decoded frames as players show them: an interlaced clip's (its field
    order, or its first frame, says so) through FFmpeg's deinterlacer
    (:data:`DEINTERLACER`), the same frames at the same times with each field's lines
    filled from its own instant, not two instants woven into combs; a progressive
    clip's as decoded."""
    import av.filter

    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        return
    order = int(getattr(stream.codec_context, "field_order", 0) or 0)
    if not first.interlaced_frame and order not in INTERLACED_ORDERS:
        yield first
        yield from frames
        return
    graph = av.filter.Graph()
    source = graph.add_buffer(
        width=first.width,
        height=first.height,
        format=first.format,
        time_base=first.time_base or stream.time_base,
    )
    deinterlacer, sink = graph.add(*DEINTERLACER), graph.add("buffersink")
    source.link_to(deinterlacer)
    deinterlacer.link_to(sink)
    graph.configure()
    for frame in itertools.chain([first], frames):
        graph.vpush(frame)
        yield from _pulled(graph)
    graph.vpush(None)
    yield from _pulled(graph)
