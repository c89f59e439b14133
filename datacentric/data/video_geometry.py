"""The geometry of video latents: benchmark resolutions and frame counts, and the
patch grid of a clip (no torch).

The latent-grid arithmetic follows the Open-Sora v1.2 benchmark (see
``docs/data.md``): ``frames * 5 // 17`` latent frames (1 for an image; the causal
VAEs of diffusers' video pipelines make ``(frames - 1) // temporal + 1``, see
:func:`causal_latent_frames`), spatial
down-sampling by 8 (rounding down, as the VAE's strided convolutions do), patches
of 1 x 2 x 2 (a partial patch is padded, rounding up). The synthetic latents
themselves are :mod:`datacentric.data.video`. What a diffusers family's VAE accepts,
which ``prepare`` plans clips by, is a :class:`Geometry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from datacentric.shapes import SampleShape

RESOLUTIONS: dict[str, tuple[int, int]] = {
    "144p": (144, 256),
    "240p": (240, 426),
    "360p": (360, 640),
    "480p": (480, 854),
    "720p": (720, 1280),
}
"""Benchmark resolutions as (height, width) in pixels (aspect 9:16)."""

VIDEO_FRAMES: tuple[int, ...] = (1, 51, 102, 204, 408)
"""Benchmark frame counts (1 is an image)."""

SPATIAL_DOWNSAMPLE = 8
PATCH: tuple[int, int, int] = (1, 2, 2)
LATENT_CHANNELS = 4


def latent_frames(frames: int) -> int:
    """Latent frames of a clip: 1 for an image, ``frames * 5 // 17`` (at least 1) else."""
    if frames < 1:
        raise ValueError(f"a clip needs at least one frame, got {frames}")
    return 1 if frames == 1 else max(1, frames * 5 // 17)


def causal_latent_frames(frames: int, temporal: int) -> int:
    """Latent frames of a ``frames``-frame bucket for a causal video VAE that takes
    ``temporal k + 1`` frames (Wan, SkyReels-V2, HunyuanVideo: ``temporal`` 4): it keeps
    the first ``temporal k + 1 <= frames`` and makes ``k + 1`` of them (1 for an image;
    ``temporal`` 1, an image VAE: one latent frame per frame)."""
    if frames < 1:
        raise ValueError(f"a clip needs at least one frame, got {frames}")
    return (frames - 1) // temporal + 1


def vae_latent_frames(frames: int, temporal: int | None = None) -> int:
    """Latent frames of ``frames`` pixel frames: a causal VAE's that takes ``temporal``
    frames per latent frame (:func:`causal_latent_frames`), or (None) Open-Sora's
    (:func:`latent_frames`)."""
    if temporal is None:
        return latent_frames(frames)
    return causal_latent_frames(frames, temporal)


@dataclass(frozen=True)
class Geometry:
    """What a family's VAE accepts: ``temporal k + 1`` frames, sizes of ``multiple``."""

    temporal: int
    multiple: int

    def latent_frames(self, frames: int) -> int:
        """Latent frames the VAE makes of a ``frames``-frame bucket (the family's rule)."""
        return causal_latent_frames(frames, self.temporal)

    def frames_below(self, frames: int) -> int:
        """The largest accepted frame count not above ``frames`` (0 if none)."""
        return 0 if frames < 1 else (self.latent_frames(frames) - 1) * self.temporal + 1


def latent_grid(
    height_px: int,
    width_px: int,
    frames: int,
    *,
    spatial_downsample: int = SPATIAL_DOWNSAMPLE,
    patch: tuple[int, int, int] = PATCH,
) -> tuple[int, int, int]:
    """Patch grid ``(frames, height, width)`` of a ``frames``-frame clip at the given pixels."""
    if height_px < 1 or width_px < 1:
        raise ValueError(f"resolution must be positive, got {height_px}x{width_px}")
    # The VAE's strided convolutions floor odd sizes (426 -> 213 -> 106 -> 53);
    # the patch embedding pads partial patches (53 -> 27 patches of 2).
    latent = (
        latent_frames(frames),
        max(1, height_px // spatial_downsample),
        max(1, width_px // spatial_downsample),
    )
    f, h, w = (math.ceil(n / p) for n, p in zip(latent, patch))
    return f, h, w


def video_shape(resolution: str, frames: int) -> SampleShape:
    """Shape of a benchmark bucket, e.g. ``video_shape("240p", 51)``."""
    if resolution not in RESOLUTIONS:
        raise KeyError(f"unknown resolution {resolution!r}; known: {', '.join(RESOLUTIONS)}")
    height, width = RESOLUTIONS[resolution]
    return SampleShape.video(*latent_grid(height, width, frames))


def benchmark_video_shapes() -> dict[tuple[str, int], SampleShape]:
    """Every (resolution, frames) bucket of the benchmark and its latent shape."""
    return {(r, n): video_shape(r, n) for r in RESOLUTIONS for n in VIDEO_FRAMES}
