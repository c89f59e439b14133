"""What a diffusion fine-tune draws for each sample: its time ``t``, its noise, whether its
caption is dropped, and (``latent_dist = sample``) its latent from the VAE's distribution.

Every draw comes from the sample's own generator,
:func:`~datacentric.data.base.sample_generator` ``(seed, sample id, epoch)`` (``[job]
seed``; the sample id is its line in the listing, 0 first), in this order, so the loss
does not depend on the world size or the policy and a user reproduces any draw outside
the library (docs/prepare.md):

1. the time: ``uniform``: ``u = torch.rand(())``, ``t = u``; ``logit_normal``:
   ``t = sigmoid(logit_mean + logit_std * torch.randn(()))`` (diffusers'
   ``compute_density_for_timestep_sampling("logit_normal", 1, ...)`` with this
   generator gives the same ``t``); ``shift``: ``u = torch.rand(())``,
   ``t = shift * u / (1 + (shift - 1) * u)`` (the flow shift of diffusers'
   ``FlowMatchEulerDiscreteScheduler``);
2. the noise, ``torch.randn((tokens, channels x patch volume))``, tokens in patch order;
3. a latent dataset's frame offset, ``torch.randint(0, F - f + 1, ())`` (0 when the latent
   is trained whole);
4. the caption draw ``torch.rand(())``: the caption is dropped when it is below
   ``caption_dropout`` (the sample then trains on the pipeline's empty-prompt embedding);
5. ``latent_dist = sample`` folders only: ``torch.randn`` of the latent's ``(channels,
   frames, height, width)`` after cropping; the latent is ``mean + exp(logvar / 2) * it``.

The model sees ``x_t = (1 - t) x0 + t noise`` and regresses ``noise - x0`` (rectified
flow, as the flow-matching pipelines train). No other draw moves these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from datacentric.data.base import sample_generator

TIMESTEP_SAMPLING = ("uniform", "logit_normal", "shift")
"""The ways ``[training] timestep_sampling`` draws ``t``."""


@dataclass(frozen=True, kw_only=True)
class DiffusionDraws:
    """How a sample's time and caption are drawn (the ``[training]`` settings of the same
    names); the defaults draw as before these settings existed."""

    caption_dropout: float = 0.0
    """Probability that a sample trains on the empty-prompt embedding."""
    timestep_sampling: str = "uniform"
    """``uniform``, ``logit_normal`` or ``shift``."""
    logit_mean: float = 0.0
    """Mean of the normal whose sigmoid is ``t`` (``logit_normal``)."""
    logit_std: float = 1.0
    """Standard deviation of that normal (``logit_normal``)."""
    flow_shift: float = 1.0
    """The scheduler's ``shift`` (``shift``; 1 is uniform)."""

    def __post_init__(self) -> None:
        if self.timestep_sampling not in TIMESTEP_SAMPLING:
            raise ValueError(
                f"training.timestep_sampling {self.timestep_sampling!r}: use one of "
                f"{', '.join(TIMESTEP_SAMPLING)}"
            )
        if not 0.0 <= self.caption_dropout <= 1.0:
            raise ValueError(
                f"training.caption_dropout {self.caption_dropout}: a probability, 0 to 1"
            )
        if not (self.logit_std > 0 and self.flow_shift > 0):
            raise ValueError("training.logit_std and training.flow_shift must be above 0")

    @classmethod
    def of(cls, training: Any) -> DiffusionDraws:
        """The draws a ``[training]`` section sets."""
        return cls(
            caption_dropout=training.caption_dropout,
            timestep_sampling=training.timestep_sampling,
            logit_mean=training.logit_mean,
            logit_std=training.logit_std,
            flow_shift=training.flow_shift,
        )

    @property
    def default(self) -> bool:
        """Whether these are the draws of a run without the settings."""
        return self == DiffusionDraws()

    def time(self, gen: torch.Generator) -> float:
        """Draw ``t`` from ``gen`` (step 1 of the module doc)."""
        if self.timestep_sampling == "logit_normal":
            z = float(torch.randn((), generator=gen))
            return 1.0 / (1.0 + math.exp(-(self.logit_mean + self.logit_std * z)))
        u = float(torch.rand((), generator=gen))
        if self.timestep_sampling == "shift":
            return self.flow_shift * u / (1.0 + (self.flow_shift - 1.0) * u)
        return u

    def caption_dropped(self, gen: torch.Generator) -> bool:
        """Draw whether the caption is dropped (step 4 of the module doc)."""
        return float(torch.rand((), generator=gen)) < self.caption_dropout


def sample_latent(mean: torch.Tensor, logvar: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A latent from the VAE's diagonal Gaussian (step 5 of the module doc):
    ``mean + exp(logvar / 2) * torch.randn(mean.shape)``, as diffusers'
    ``DiagonalGaussianDistribution.sample`` (its log-variance clamped to [-30, 20])."""
    noise = torch.randn(mean.shape, generator=gen)
    return mean + torch.exp(0.5 * logvar.clamp(-30.0, 20.0)) * noise


def render_generator(seed: int, prompt: int, prompt_seed: int | None = None) -> torch.Generator:
    """The generator a validation render draws from (its ``generator=``): prompt number
    ``prompt`` of the prompts file (from 0, blank lines not counted) under the run's
    ``[job] seed``: ``torch.Generator().manual_seed(prompt_seed)`` when its JSON line
    sets ``seed``, else ``sample_generator(seed, prompt)``. The same at every step and on
    a rerun; a pipeline called with it, the trained transformer and the prompt's settings
    renders what the run rendered."""
    if prompt_seed is not None:
        return torch.Generator().manual_seed(int(prompt_seed))
    return sample_generator(seed, prompt)


def held_out_generator(seed: int, sample_id: int) -> torch.Generator:
    """The generator a held-out sample's ``t`` and noise (and caption and latent) are
    drawn from, in the order of the module doc: epoch 0 of the sample (its id in the
    whole dataset, before a ``split=``), the same at every validation."""
    return sample_generator(seed, sample_id, 0)
