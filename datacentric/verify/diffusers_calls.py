"""How each diffusers pipeline calls its transformer on one clip: the reference side.

:func:`pipeline_call` runs a diffusers transformer's own ``forward`` on one clip
``(1, C, F, H, W)`` of latents with the inputs its diffusers pipeline passes, built
here from diffusers' own pipeline helpers (``CogVideoXPipeline``'s rotary grid,
``FluxPipeline``'s packing and image ids) and from the latents file layout of
``docs/data.md`` (for HunyuanVideo and Flux the text file's first row holds the pooled
projection and a row of zeros only is padding). It shares no code with the adapters of
:mod:`datacentric.models`; ``verify.reference.own_video_forward`` sends the families
whose declaration names a ``pipeline_call`` (:mod:`datacentric.models.diffusers_families`)
here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace

import torch
from torch import nn

from datacentric.models.diffusers_families import Family, FamilyView, family_named

#: the guidance scale each guidance-distilled pipeline passes by default
HUNYUAN_GUIDANCE = 6.0
FLUX_GUIDANCE = 3.5


def _pooled_text(model: nn.Module, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled projections ``(1, P)``, text embeddings ``(1, L, D)``) of a text file."""
    return text[:, 0, : model.config.pooled_projection_dim], text[:, 1:]


def cogvideox_call(
    model: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    """``CogVideoXPipeline``'s call: frames before channels, its rotary grid."""
    from diffusers import CogVideoXPipeline

    f, h, w = latents.shape[2:]
    rotary = None
    if model.config.use_rotary_positional_embeddings:  # latents: a VAE scale of 1
        pipe = SimpleNamespace(vae_scale_factor_spatial=1, transformer=model)
        rotary = CogVideoXPipeline._prepare_rotary_positional_embeddings(
            pipe, h, w, f, latents.device
        )
    out = model(
        hidden_states=latents.permute(0, 2, 1, 3, 4),
        encoder_hidden_states=text,
        timestep=timestep,
        image_rotary_emb=rotary,
        return_dict=False,
    )[0]
    return out.permute(0, 2, 1, 3, 4)


def hunyuan_video_call(
    model: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    """``HunyuanVideoPipeline``'s call: text mask, pooled projections, guidance x 1000."""
    pooled, embeds = _pooled_text(model, text)
    mask = (embeds != 0).any(dim=-1).to(embeds.dtype)
    guidance = None
    if model.config.guidance_embeds:
        guidance = torch.tensor([HUNYUAN_GUIDANCE], dtype=embeds.dtype) * 1000.0
    return model(
        hidden_states=latents,
        timestep=timestep,
        encoder_hidden_states=embeds,
        encoder_attention_mask=mask,
        pooled_projections=pooled,
        guidance=guidance,
        return_dict=False,
    )[0]


def flux_call(
    model: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor:
    """``FluxPipeline``'s call on one image ``(1, C, 1, H, W)``: its packed 2 x 2 tokens,
    image and text ids, ``timestep / 1000``, guidance."""
    from diffusers import FluxPipeline

    _, c, f, h, w = latents.shape
    if f != 1:
        raise ValueError(f"Flux takes images: a latent of {f} frames")
    pooled, embeds = _pooled_text(model, text)
    packed = FluxPipeline._pack_latents(latents[:, :, 0], 1, c, h, w)
    device, dtype = latents.device, embeds.dtype
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, device, dtype)
    guidance = None
    if model.config.guidance_embeds:
        guidance = torch.full([1], FLUX_GUIDANCE, dtype=torch.float32)
    out = model(
        hidden_states=packed,
        timestep=timestep / 1000,
        guidance=guidance,
        pooled_projections=pooled,
        encoder_hidden_states=embeds,
        txt_ids=torch.zeros(embeds.shape[1], 3, dtype=embeds.dtype),
        img_ids=img_ids,
        return_dict=False,
    )[0]
    return FluxPipeline._unpack_latents(out, h, w, 1)[:, :, None]


def call_of(family: Family | None) -> Callable[..., torch.Tensor] | None:
    """The pipeline call a family declares (``pipeline_call``: a function of this module
    by name, or a function), or None."""
    call = family.pipeline_call if family is not None else None
    return globals()[call] if isinstance(call, str) else call


PIPELINE_CALLS: Mapping[str, Callable[..., torch.Tensor]] = FamilyView(
    lambda family: (family.transformer, call_of(family)) if family.pipeline_call else None
)
"""Diffusers classes whose pipeline passes more than latents, timestep and text: a view
of the families' ``pipeline_call`` (:mod:`datacentric.models.diffusers_families`)."""


def pipeline_call(
    model: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor
) -> torch.Tensor | None:
    """The prediction ``(1, C, F, H, W)`` of ``model`` called as its pipeline calls it,
    or None for a class whose family declares no ``pipeline_call``. ``timestep``:
    ``1000 t``."""
    call = call_of(family_named(type(model).__name__))
    return None if call is None else call(model, latents, timestep, text)
