"""Which source frames each sample of a clip is made of: ``prepare``'s sampling options,
named as finetrainers and musubi-tuner name theirs (no torch).

A clip's frames go through, in order:

1. ``target_fps`` (default: the clip's own frames): output frame ``i`` is the source
   frame whose timestamp is nearest to ``i / target_fps`` seconds after the first
   frame's (a tie goes to the earlier frame), for every ``i`` with ``i / target_fps``
   not after the last frame's timestamp; a 30 fps clip at ``target_fps = 16`` keeps
   about 16 of each 30 frames, a 12 fps clip repeats some.
2. ``frame_stride`` (default 1): every ``frame_stride``-th frame of that, from the first.
3. Frames per sample: the VAE's largest accepted count (``4k + 1``) not above the frames
   left nor ``max_frames``, or the bucket's (``--bucket-config``).
4. ``frame_extraction``: ``head``, the first frames (the default without a bucket
   config); ``uniform``, frames spread evenly over the clip, first and last kept (the
   default with one); ``slide``, ``windows`` runs of consecutive frames (default 1),
   starting every ``window_stride`` frames (default: spread evenly from the first
   frame to the last run that fits); ``chunk``, back-to-back runs from the first frame,
   as many as fit (at most ``windows`` when given). Each run is a sample of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from datacentric.data.base import DataError

EXTRACTIONS = ("head", "uniform", "slide", "chunk")


@dataclass(frozen=True, kw_only=True)
class FrameSampling:
    """``prepare``'s sampling options (see the module docstring)."""

    max_frames: int | None = None
    """Frames per sample at most (default: as many as the clip and bucket give)."""
    frame_stride: int = 1
    """Keep every n-th frame (after ``target_fps``)."""
    target_fps: float | None = None
    """Frame rate the frames are resampled to (default: the clip's own frames)."""
    frame_extraction: str | None = None
    """``head``, ``uniform``, ``slide`` or ``chunk`` (default: ``head``; ``uniform`` with
    a bucket config)."""
    windows: int | None = None
    """Samples per clip under ``slide`` (default 1) and ``chunk`` (default: all that fit)."""
    window_stride: int | None = None
    """Frames from one ``slide`` window's start to the next (default: spread evenly)."""

    def __post_init__(self) -> None:
        for flag, value, least in (
            ("--max-frames", self.max_frames, 1),
            ("--frame-stride", self.frame_stride, 1),
            ("--windows", self.windows, 1),
            ("--window-stride", self.window_stride, 1),
        ):
            if value is None and flag != "--frame-stride":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise DataError(f"{flag} {value!r}: must be an integer >= {least}")
        if self.target_fps is not None and not (
            isinstance(self.target_fps, int | float) and 0 < self.target_fps < float("inf")
        ):
            raise DataError(f"--target-fps {self.target_fps!r}: must be a number > 0")
        if self.frame_extraction not in (None, *EXTRACTIONS):
            raise DataError(
                f"--frame-extraction {self.frame_extraction!r}: choose one of "
                f"{', '.join(EXTRACTIONS)}"
            )
        several = self.frame_extraction in ("slide", "chunk")
        if not several and (self.windows is not None or self.window_stride is not None):
            raise DataError(
                "--windows and --window-stride take --frame-extraction slide or chunk "
                f"(got {self.frame_extraction or 'the default'})"
            )
        if self.window_stride is not None and self.frame_extraction != "slide":
            raise DataError("--window-stride takes --frame-extraction slide")

    @property
    def needs_times(self) -> bool:
        """Whether planning needs every frame's timestamp (``target_fps``)."""
        return self.target_fps is not None


def resample(times: Sequence[Fraction | float], fps: float) -> list[int]:
    """Source frame indices at ``fps``: output frame ``i`` is the frame whose timestamp
    (``times``, in presentation order) is nearest to ``times[0] + i / fps``, a tie to
    the earlier, for ``i / fps`` up to the last timestamp."""
    if not times:
        return []
    step = Fraction(fps).limit_denominator(1_000_000)
    start = Fraction(times[0])
    exact = [Fraction(t) - start for t in times]
    out, i = [], 0
    while Fraction(i) / step <= exact[-1]:
        target = Fraction(i) / step
        j = bisect.bisect_left(exact, target)
        candidates = [k for k in (j - 1, j) if 0 <= k < len(exact)]
        out.append(min(candidates, key=lambda k: (abs(exact[k] - target), k)))
        i += 1
    return out


def frame_line(frames: int, times: Sequence | None, sampling: FrameSampling) -> list[int]:
    """Source frame indices a clip of ``frames`` frames has after ``target_fps`` (from
    ``times``) and ``frame_stride``."""
    if sampling.target_fps is not None:
        if times is None:
            raise ValueError("target_fps needs the frames' timestamps")
        line = resample(times, sampling.target_fps)
    else:
        line = list(range(frames))
    return line[:: sampling.frame_stride]


def even_frames(total: int, count: int) -> tuple[int, ...]:
    """``count`` frame indices spread evenly over ``total`` frames, first and last kept."""
    if count == 1:
        return (0,)
    return tuple(round(i * (total - 1) / (count - 1)) for i in range(count))


def window_positions(
    length: int, count: int, sampling: FrameSampling, default: str
) -> list[tuple[int, ...]]:
    """Positions (into a line of ``length`` frames) of each sample of ``count`` frames,
    by ``sampling.frame_extraction`` (``default`` when unset); ``count <= length``."""
    how = sampling.frame_extraction or default
    if how == "uniform":
        return [even_frames(length, count)]
    if how == "head":
        starts = [0]
    elif how == "chunk":
        starts = list(range(0, length - count + 1, count))[: sampling.windows]
    elif sampling.window_stride is not None:
        starts = list(range(0, length - count + 1, sampling.window_stride))
        starts = starts[: sampling.windows or 1]
    else:
        runs = sampling.windows or 1
        last = length - count
        starts = [0] if runs == 1 else sorted({round(k * last / (runs - 1)) for k in range(runs)})
    return [tuple(range(s, s + count)) for s in starts]
