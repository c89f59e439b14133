"""Synthetic video latents for the diffusion model, and video bucket shapes.

A sample is a latent video of ``frames x height x width`` patches (its
:class:`~datacentric.shapes.SampleShape` grid). Each token holds one patch:
``channels x patch_f x patch_h x patch_w`` values (4 x 1 x 2 x 2 = 16 by default).

Everything a sample needs is drawn from a generator seeded by ``(seed, sample id)``
only, in a fixed order: the diffusion time ``t ~ U[0, 1)``, the clean latents
``x0`` (a sum of a few random low-frequency 3D waves per channel, so there is
structure to learn, with unit variance), then the noise ``eps ~ N(0, 1)``.
Training follows rectified flow: the model sees ``x_t = (1 - t) x0 + t eps`` and
regresses the velocity ``eps - x0``.

The latent-grid arithmetic (bucket resolutions, frame counts, patch grids) is
:mod:`datacentric.data.video_geometry` (public through :mod:`datacentric.data`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from datacentric.batch import PackedBatch
from datacentric.data.base import (
    ShapeListDataset,
    check_sample_ids,
    sample_generator,
    segment_layout,
)
from datacentric.data.diffusion_draws import DiffusionDraws
from datacentric.data.video_geometry import LATENT_CHANNELS, PATCH
from datacentric.shapes import SampleShape


@dataclass(frozen=True)
class VideoSample:
    """One sample's clean latents, noise (both ``(S, C)``), diffusion time and, for
    models that cross-attend to text, its text embedding ``(L, D)``."""

    x0: torch.Tensor
    noise: torch.Tensor
    t: float
    context: torch.Tensor | None = None


def grid_positions(grid: tuple[int, int, int]) -> torch.Tensor:
    """(frame, row, column) of every patch in row-major order, ``(f * h * w, 3)`` int64."""
    axes = [torch.arange(n, dtype=torch.long) for n in grid]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)


class SyntheticVideoDataset(ShapeListDataset):
    """Latent videos of the given shapes, deterministic in (seed, sample id)."""

    is_video = True

    def __init__(
        self,
        shapes: Sequence[SampleShape],
        channels: int = LATENT_CHANNELS,
        seed: int = 0,
        *,
        patch: tuple[int, int, int] = PATCH,
        num_waves: int = 4,
        context_shape: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(shapes, seed)
        self.channels = channels
        self.patch = tuple(patch)
        self.num_waves = num_waves
        #: (tokens, width) of each sample's synthetic text embedding (None: none)
        self.context_shape = context_shape

    @property
    def token_dim(self) -> int:
        """Values per token: channels x patch volume (the model's ``in_channels``)."""
        return self.channels * math.prod(self.patch)

    def loss_tokens(self, sample_id: int) -> int:
        """Every patch carries loss."""
        return self.shape(sample_id).tokens

    def sample(self, sample_id: int, epoch: int = 0) -> VideoSample:
        """Draw sample ``sample_id``: time, clean latents and noise (float32).

        The clean latents depend on (seed, sample id) only; time and noise also on
        the epoch (epoch 0 draws them as before epochs existed)."""
        (sample_id,) = check_sample_ids([sample_id], len(self))
        grid = self._shapes[sample_id].grid
        assert grid is not None
        gen = sample_generator(self.seed, sample_id)
        t = float(torch.rand((), generator=gen))
        x0 = self._clean_latents(grid, gen)
        noise = torch.randn(x0.shape, generator=gen)
        context = torch.randn(self.context_shape, generator=gen) if self.context_shape else None
        if epoch:
            t, noise = draw_time_and_noise(x0.shape, sample_generator(self.seed, sample_id, epoch))
        return VideoSample(x0=x0, noise=noise, t=t, context=context)

    def _clean_latents(self, grid: tuple[int, int, int], gen: torch.Generator) -> torch.Tensor:
        """Sum of random 3D waves per channel on the latent pixels, patchified to ``(S, C)``."""
        pf, ph, pw = self.patch
        dims = (grid[0] * pf, grid[1] * ph, grid[2] * pw)
        k = self.num_waves
        # Frequencies in cycles per latent pixel (low: smooth content), phases, amplitudes.
        freqs = (torch.rand((self.channels, k, 3), generator=gen) - 0.5) * 0.3
        phases = torch.rand((self.channels, k), generator=gen) * (2 * math.pi)
        amps = torch.randn((self.channels, k), generator=gen) * math.sqrt(2.0 / k)
        f_idx, y_idx, x_idx = (torch.arange(n, dtype=torch.float32) for n in dims)
        f_idx, y_idx, x_idx = f_idx[:, None, None], y_idx[None, :, None], x_idx[None, None, :]
        latents = torch.zeros((self.channels, *dims))
        for c in range(self.channels):
            for j in range(k):
                fr = freqs[c, j]
                arg = 2 * math.pi * (fr[0] * f_idx + fr[1] * y_idx + fr[2] * x_idx) + phases[c, j]
                latents[c] += amps[c, j] * torch.cos(arg)
        return patchify(latents, self.patch)

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples: noisy latents in, velocity targets, (frame, row, col) positions."""
        ids = check_sample_ids(sample_ids, len(self))
        grids = [self._shapes[i].grid for i in ids]
        samples = [self.sample(i, epoch) for i in ids]
        return pack_video_samples(ids, grids, samples, self.token_dim, pad_to_multiple)


def draw_time_and_noise(
    shape: torch.Size | tuple[int, ...],
    gen: torch.Generator,
    draws: DiffusionDraws | None = None,
) -> tuple[float, torch.Tensor]:
    """Diffusion time ``t`` as ``draws`` samples it (unset: ``t ~ U[0, 1)``) then noise
    ``eps ~ N(0, 1)`` of ``shape``, in that order (:mod:`datacentric.data.diffusion_draws`)."""
    t = (draws or DiffusionDraws()).time(gen)
    return t, torch.randn(shape, generator=gen)


def patchify(latents: torch.Tensor, patch: tuple[int, int, int] = PATCH) -> torch.Tensor:
    """``(C, F, H, W)`` latents -> ``(S, C * patch volume)`` tokens, patches row-major over
    (frame, row, column); each dimension must be a multiple of its patch size."""
    c, f, h, w = latents.shape
    pf, ph, pw = patch
    x = latents.reshape(c, f // pf, pf, h // ph, ph, w // pw, pw)
    return x.permute(1, 3, 5, 0, 2, 4, 6).reshape(-1, c * pf * ph * pw)


def pack_video_samples(
    sample_ids: Sequence[int],
    grids: Sequence[tuple[int, int, int] | None],
    samples: Sequence[VideoSample],
    token_dim: int,
    pad_to_multiple: int = 1,
) -> PackedBatch:
    """Pack drawn samples by rectified flow: inputs ``(1 - t) x0 + t eps``, targets
    ``eps - x0``, (frame, row, column) positions, ``sample_cond = t``; one padding
    segment of zeros."""
    layout = segment_layout(sample_ids, [s.x0.shape[0] for s in samples], pad_to_multiple)
    inputs, targets, positions, times = [], [], [], []
    for grid, s in zip(grids, samples):
        assert grid is not None
        inputs.append((1.0 - s.t) * s.x0 + s.t * s.noise)
        targets.append(s.noise - s.x0)
        positions.append(grid_positions(grid))
        times.append(s.t)
    if layout.padding:
        inputs.append(torch.zeros((layout.padding, token_dim)))
        targets.append(torch.zeros((layout.padding, token_dim)))
        positions.append(torch.zeros((layout.padding, 3), dtype=torch.long))
    contexts = [s.context for s in samples]
    if any(c is None for c in contexts) and any(c is not None for c in contexts):
        raise ValueError("some samples of the micro-batch have a text embedding, others not")
    shapes = {tuple(c.shape) for c in contexts if c is not None}
    if len(shapes) > 1:
        raise ValueError(
            f"the text embeddings of samples {list(layout.sample_ids)} have different shapes "
            f"{sorted(shapes)}: pad them to one length (as the text encoder's pipeline does)"
        )
    return PackedBatch(
        sample_ids=layout.sample_ids,
        cu_seqlens=layout.cu_seqlens,
        inputs=torch.cat(inputs),
        targets=torch.cat(targets),
        position_ids=torch.cat(positions),
        segment_ids=layout.segment_ids,
        loss_mask=layout.segment_ids >= 0,
        sample_cond=torch.tensor(times, dtype=torch.float32),
        sample_context=torch.stack(contexts) if contexts[0] is not None else None,
    )
