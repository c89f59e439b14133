"""The independent side of the equivalence check: the unmodified model, each sample alone.

A :class:`Reference` holds a *fresh* model built from the same seed as the distributed
side's (never the instance we wrapped, patched or sharded) and computes one sample's
loss with the model's own ``forward`` on that sample alone, in one process. None of
our attention, packing across samples, sharding, recomputation or loss weighting is on
this path:

- a Hugging Face causal LM: the inner ``transformers`` model, built unmodified (its
  default attention implementation, its own masks and rotary embedding), called on
  one sample's ``input_ids`` alone (no ``position_ids``: the model counts positions
  itself); the loss is ``F.cross_entropy`` of its logits against the next tokens
  (:func:`causal_lm_sample_loss`);
- our presets and a user's ``pkg.module:factory`` model: the model's own ``forward`` on
  a one-sample batch with the attention it was built with (never an injected one)
  (:func:`packed_model_sample_loss`);
- a diffusers video transformer: the transformer's own ``forward`` on one clip
  ``(1, C, F, H, W)`` with its timestep and text embedding, the loss the mean squared
  error against the velocity (:func:`video_sample_loss`, the hook a diffusers case
  plugs its unmodified transformer into).

The global-batch loss then combines the per-sample sums as the runtime's loss mode
says: ``"token"``, the sum over every loss token divided by their count; ``"sample"``,
the mean over samples of each sample's mean (:func:`reference_loss`). Dropout is off
(the model is in ``eval()`` mode), as on the distributed side.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.data.base import Dataset

IGNORE_INDEX = -100
"""Targets that carry no loss (``torch.nn.functional.cross_entropy``'s default)."""

SampleLoss = Callable[[int], tuple[torch.Tensor, int]]
"""``sample_id -> (sum of the sample's per-token losses, number of loss tokens)``."""


@dataclass
class Reference:
    """An unmodified model and how it computes one sample's loss alone."""

    #: the unmodified model whose gradients are compared (in ``eval()`` mode)
    module: nn.Module
    #: how the distributed side names its parameters: ``prefix + name`` (``"hf."``)
    prefix: str
    #: ``"token"`` or ``"sample"``, as the distributed side's ``loss_mode``
    loss_mode: str
    #: one sample's loss sum and loss-token count
    sample_loss: SampleLoss
    #: which code runs, in words (printed in the report)
    description: str


def reference_loss(reference: Reference, sample_ids: Sequence[int]) -> torch.Tensor:
    """The global-batch loss from each sample alone, combined as ``loss_mode`` says."""
    sums, counts = zip(*(reference.sample_loss(i) for i in sample_ids))
    if reference.loss_mode == "token":
        return torch.stack(list(sums)).sum() / sum(counts)
    means = [s / c for s, c in zip(sums, counts) if c > 0]
    return torch.stack(means).mean()


def reference_grads(reference: Reference) -> dict[str, torch.Tensor]:
    """Every trained parameter's gradient under the distributed side's name (zeros if
    unused); frozen ones (LoRA's base) have none."""
    return {
        reference.prefix + name: (
            p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        )
        for name, p in reference.module.named_parameters()
        if p.requires_grad
    }


def causal_lm_sample_loss(hf_model: nn.Module, dataset: Dataset) -> SampleLoss:
    """One sample through an unmodified transformers ``*ForCausalLM`` alone: its logits
    for the sample's tokens, cross-entropy against the next tokens where the dataset
    marks a loss (summed); with ``output_router_logits=True``, plus the model's own
    router auxiliary loss of the sample (``router_aux_loss_coef * aux_loss``, as its own
    loss adds it) once per loss token."""

    def sample_loss(sample_id: int) -> tuple[torch.Tensor, int]:
        one = dataset.pack([sample_id], 1)  # the sample's tokens and next-token targets
        device = next(hf_model.parameters()).device
        input_ids = one.inputs.long().to(device)
        targets = torch.where(one.loss_mask, one.targets.long(), IGNORE_INDEX).to(device)
        out = hf_model(input_ids=input_ids[None], use_cache=False)
        loss = F.cross_entropy(
            out.logits[0].float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
        )
        count = int(one.loss_mask.sum())
        aux = getattr(out, "aux_loss", None)  # the model's own router loss of the sample
        if aux is not None:
            loss = loss + count * hf_model.router_aux_loss_coef * aux.float()
        return loss, count

    return sample_loss


def packed_model_sample_loss(model: nn.Module, dataset: Dataset) -> SampleLoss:
    """One sample through a model of the packed contract alone: a one-sample batch
    through its own ``forward`` and its own attention; the sum of its per-token loss."""

    def sample_loss(sample_id: int) -> tuple[torch.Tensor, int]:
        device = next(model.parameters()).device
        one = dataset.pack([sample_id], 1).to(device)
        loss_S = model(one)
        return loss_S[one.loss_mask].float().sum(), int(one.loss_mask.sum())

    return sample_loss


def video_sample_loss(
    transformer: nn.Module,
    dataset: Dataset,
    *,
    channels: int,
    patch: tuple[int, int, int],
    timestep_scale: float,
) -> SampleLoss:
    """One clip through an unmodified diffusers video transformer alone: noisy latents
    ``(1, C, F, H, W)`` (rectified flow, ``(1 - t) x0 + t noise``), timestep
    ``t * timestep_scale`` and the clip's text embedding into its own ``forward``; the
    loss is the squared error against the velocity ``noise - x0``, summed over every
    value (its count is the clip's tokens; each token's loss is the mean over its
    ``channels x patch`` values, as the packed side computes it).

    ``dataset.sample(i)`` gives ``x0``, ``noise`` (patch tokens ``(S, C * patch volume)``
    in (channel, frame, row, column) order), ``t`` and ``context``, and
    ``dataset.shapes()[i].grid`` the clip's latent grid in patches."""
    pf, ph, pw = patch

    def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        f, h, w = grid
        x = tokens.reshape(f, h, w, channels, pf, ph, pw).permute(3, 0, 4, 1, 5, 2, 6)
        return x.reshape(channels, f * pf, h * ph, w * pw)

    def sample_loss(sample_id: int) -> tuple[torch.Tensor, int]:
        sample = dataset.sample(sample_id)
        grid = dataset.shapes()[sample_id].grid
        noisy = unpatchify((1 - sample.t) * sample.x0 + sample.t * sample.noise, grid)
        target = unpatchify(sample.noise - sample.x0, grid)
        timestep = torch.tensor([sample.t * timestep_scale])
        out = own_video_forward(transformer, noisy[None], timestep, sample.context[None])
        tokens = sample.x0.shape[0]
        per_value = (out.float() - target[None].float()).pow(2)
        # each token's loss is the mean over its values; the sum over tokens is then
        # the sum over all values divided by the values per token
        return per_value.sum() / (per_value.numel() // tokens), tokens

    return sample_loss


def own_video_forward(
    transformer: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    """The prediction ``(1, C, F, H, W)`` of a diffusers video transformer's own
    ``forward`` on one clip, called as its pipeline calls it: a model that takes packed
    tokens with ``num_frames``/``height``/``width`` (LTX-Video) gets the latents packed by
    its pipeline's own ``_pack_latents`` (and the output unpacked by ``_unpack_latents``);
    any other gets the latent video itself (Wan), or, for a family whose pipeline passes
    more (CogVideoX, HunyuanVideo, Flux), what :mod:`~.diffusers_calls` says."""
    from datacentric.verify.diffusers_calls import pipeline_call

    out = pipeline_call(transformer, latents, timestep, text)
    if out is not None:
        return out
    if "num_frames" not in inspect.signature(transformer.forward).parameters:
        return transformer(
            hidden_states=latents, timestep=timestep, encoder_hidden_states=text
        ).sample
    from diffusers import LTXPipeline

    p, pt = int(transformer.config.patch_size), int(transformer.config.patch_size_t)
    f, h, w = latents.shape[2:]
    out = transformer(
        hidden_states=LTXPipeline._pack_latents(latents, p, pt),
        encoder_hidden_states=text,
        timestep=timestep,
        encoder_attention_mask=None,
        num_frames=f // pt,
        height=h // p,
        width=w // p,
    ).sample
    return LTXPipeline._unpack_latents(out, f // pt, h // p, w // p, p, pt)


def unmodified_copy(module: nn.Module, build: Callable[[], nn.Module]) -> nn.Module:
    """A fresh instance from ``build()`` holding ``module``'s weights: for a model the
    factory hands us already wrapped (so its own instance has been patched)."""
    fresh = build()
    fresh.load_state_dict(copy.deepcopy(module.state_dict()))
    return fresh


def peft_copy(module: nn.Module, build: Callable[[], nn.Module], lora: Any) -> nn.Module:
    """A fresh unmodified model from ``build()`` adapted by ``peft.get_peft_model`` with
    ``lora``'s settings (a :class:`~datacentric.models.lora.LoraSpec`), holding
    ``module``'s weights, base and adapters: the single-process peft reference."""
    import peft

    wrapped = peft.get_peft_model(build(), reference_lora_config(lora))
    wrapped.get_base_model().load_state_dict(copy.deepcopy(module.state_dict()))
    return wrapped


def reference_lora_config(lora: Any) -> Any:
    """``peft.LoraConfig`` of a :class:`~datacentric.models.lora.LoraSpec`, written here
    from its fields (the reference builds its adapters without our code)."""
    import peft

    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha if lora.alpha is not None else lora.rank,
        lora_dropout=lora.dropout,
        target_modules=list(lora.targets),
    )
