"""The frames and pixel size a clip is encoded at by ``datacentric prepare``
(:func:`plan_clip`), or why it cannot be (too short, too small, no bucket keeps it),
from what :func:`~datacentric.data.media_decode.probe` read of it: the frames sampled
as :mod:`datacentric.data.frame_sampling` says, a size the family's VAE accepts
(:class:`~datacentric.data.video_geometry.Geometry`), and with ``--bucket-config`` the
bucket that keeps it, drawn by :func:`clip_rng`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datacentric.data.bucket_config import BucketConfig, closest_ratio
from datacentric.data.frame_sampling import FrameSampling, frame_line, window_positions
from datacentric.data.media_decode import MediaInfo
from datacentric.data.media_sources import MediaItem
from datacentric.data.video_geometry import Geometry
from datacentric.progress import counted


@dataclass(frozen=True)
class ClipPlan:
    """The frames and pixel size a clip is encoded at: one sample, or several (windows
    of ``--frame-extraction slide`` or ``chunk``)."""

    frames: tuple[int, ...]
    """Indices of the decoded frames kept, in order (the first sample's)."""
    height: int
    width: int
    bucket: str
    rotated: bool = False
    """The file's pixels are stored turned (:attr:`MediaInfo.rotated`): decoded upright."""
    more: tuple[tuple[int, ...], ...] = ()
    """The frame indices of each further sample of the clip."""

    @property
    def windows(self) -> tuple[tuple[int, ...], ...]:
        """Every sample's frame indices, the first sample's first."""
        return (self.frames, *self.more)

    @property
    def cost(self) -> int:
        """Encoding cost: frames x pixels, over every sample."""
        return sum(len(w) for w in self.windows) * self.height * self.width


def plan_clip(
    info: MediaInfo,
    geometry: Geometry,
    *,
    is_image: bool,
    buckets: BucketConfig | None = None,
    rng: np.random.Generator | None = None,
    sampling: FrameSampling | None = None,
) -> ClipPlan | str:
    """The :class:`ClipPlan` of a clip, or the reason it is skipped.

    A video's frames are first resampled and strided as ``sampling`` says
    (:mod:`~datacentric.data.frame_sampling`; default: every frame). Without
    ``buckets``: the clip's own size rounded down to ``geometry.multiple``
    (centre-cropped) and as many frames as the VAE accepts (at most ``max_frames``), its
    first ones. With ``buckets`` (Open-Sora's format): from the largest resolution down,
    the aspect ratio closest to the clip's, a size the clip reaches (rounded down to the
    multiple), the largest frame count it has (rounded down to an accepted count),
    sampled evenly over the clip, kept with the bucket's probability. ``sampling``'s
    ``frame_extraction`` picks other windows, several with ``slide`` and ``chunk``.
    """
    sampling = sampling or FrameSampling()
    m = geometry.multiple
    if info.height < m or info.width < m:
        return f"too small: {info.height}x{info.width} pixels, the VAE needs {m}x{m}"
    line = [0] if is_image else frame_line(info.frames, info.times, sampling)
    least = 1 if is_image else geometry.temporal + 1
    if len(line) < least:
        after = "" if len(line) == info.frames else " after --target-fps/--frame-stride"
        return f"too short: {counted(len(line), 'frame')}{after}, the VAE needs {least}"
    cap = len(line) if is_image else min(len(line), sampling.max_frames or len(line))
    if buckets is None:
        count = 1 if is_image else geometry.frames_below(cap)
        h, w = info.height // m * m, info.width // m * m
        return _windows(line, count, h, w, f"{count}x{h}x{w}", info, sampling, "head")
    rng = rng or np.random.default_rng(0)
    for res, sizes, probs in buckets.table:
        ratio = closest_ratio(sizes, info.height / info.width)
        h, w = (n // m * m for n in sizes[ratio])
        if info.height < h or info.width < w or min(h, w) < m:
            continue
        fits = [
            (n, p) for n, p in probs if (n == 1) == is_image and 0 < geometry.frames_below(n) <= cap
        ]
        if not fits:
            continue
        frames, keep = fits[0]
        if keep >= 1 or rng.random() < keep:
            count = geometry.frames_below(frames)
            name = f"{res}-{ratio}-{frames}f"
            return _windows(line, count, h, w, name, info, sampling, "uniform")
    return "no bucket of --bucket-config keeps it (too short, too small, or not drawn)"


def _windows(
    line: list[int],
    count: int,
    h: int,
    w: int,
    bucket: str,
    info: MediaInfo,
    sampling: FrameSampling,
    default: str,
) -> ClipPlan:
    """The plan of ``count``-frame samples of ``line`` (source frame indices)."""
    runs = window_positions(len(line), count, sampling, default)
    picked = [tuple(line[p] for p in run) for run in runs]
    return ClipPlan(picked[0], h, w, bucket, info.rotated, tuple(picked[1:]))


def clip_rng(item: MediaItem, seed: int) -> np.random.Generator:
    """The draw of a clip's bucket keep-probabilities, from its name and the seed."""
    return np.random.default_rng([int(seed), int(item.name.rsplit("-", 1)[1], 16)])
