"""What the generic diffusers path needs to know of a family, declared as data.

The generic path (:mod:`datacentric.models.diffusers_generic`) runs a diffusers
transformer's own ``forward`` once per group of same-shape clips and splits the video
sequence across the SP group where a context-parallel plan says. A family whose class
declares no plan (SkyReels-V2, CogVideoX, HunyuanVideo), or one whose plan splits the
text (Flux), is declared here: a :class:`Family` says

- ``cp_plan``: where the video sequence is split and gathered, in diffusers' format
  (:class:`SplitInput`/:class:`GatherOutput` read like diffusers'
  ``ContextParallelInput``/``ContextParallelOutput``). The text always stays whole on
  every rank of an SP group;
- ``text_first``: where the text sits in a joint attention (one attention over the text
  and video tokens joined): first (CogVideoX, Flux) or last (HunyuanVideo); None for
  a family without one. Under sequence parallelism :func:`joint_attention` gathers the
  video keys and values of the group and each rank attends with its own video queries
  and the whole text's;
- ``layout``: how the latents enter ``forward``: ``"video"`` ``(B, C, F, H, W)``,
  ``"frames_first"`` ``(B, F, C, H, W)`` (CogVideoX), ``"tokens"`` the ``(B, S, C x 4)``
  packed tokens of an image pipeline (Flux: ``patch`` (1, 2, 2) latent pixels a token,
  its ``in_channels`` counts a token's values);
- ``pooled``: ``pooled_projections`` (and a text mask) come from the text file: its first
  row holds the pooled projection (its first ``pooled_projection_dim`` values), the
  other rows the text tokens; a text row of zeros only is padding (masked where the
  model takes a mask). ``docs/data.md`` shows the files;
- ``timestep_scale``: what ``forward`` takes for the rectified-flow time ``t``
  (``1000 t``; Flux multiplies by 1000 itself); ``guidance``: the guidance scale a
  guidance-distilled model is given (as its pipeline passes it);
- ``blocks``: the lists of repeated blocks (recomputation), when the class names none;
- ``refused``: config fields whose other values need inputs the latent files do not
  hold (``field -> (the value that runs, what is missing)``).

Nothing here imports diffusers: per-sample inputs built from diffusers functions
(rotary grids, image ids) import them when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SplitInput:
    """A plan entry that splits an input (or, ``split_output``, an output) along
    ``split_dim`` when it has ``expected_dims`` dimensions (diffusers'
    ``ContextParallelInput``)."""

    split_dim: int
    expected_dims: int | None = None
    split_output: bool = False


@dataclass(frozen=True)
class GatherOutput:
    """A plan entry that gathers an output along ``gather_dim`` (diffusers'
    ``ContextParallelOutput``)."""

    gather_dim: int
    expected_dims: int | None = None


ExtraInputs = Callable[[Any, tuple[int, int, int], int, torch.Tensor], dict[str, Any]]
"""``(config, model grid (frames, rows, columns), clips, a hidden-states tensor) ->
keyword arguments`` a family's pipeline passes beside the latents."""


@dataclass(frozen=True)
class Family:
    """One family's declaration (see the module docstring)."""

    cp_plan: dict[str, Any]
    text_first: bool | None = None
    layout: str = "video"
    patch: tuple[int, int, int] | None = None
    pooled: bool = False
    timestep_scale: float = 1000.0
    guidance: float | None = None
    blocks: tuple[str, ...] = ()
    refused: dict[str, tuple[Any, str]] = field(default_factory=dict)
    extra_inputs: ExtraInputs | None = None
    fills: tuple[str, ...] = ()
    """``forward`` arguments without a default that the family fills."""


def _cogvideox_rotary(config: Any, grid: tuple[int, int, int], clips: int, x: torch.Tensor):
    """CogVideoX's rotary angles for one clip grid, as its pipeline builds them (the
    grid of the clip itself, cropped from the base size the model was trained at)."""
    if not config.get("use_rotary_positional_embeddings"):
        return {}
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    frames, rows, cols = grid
    patch = int(config.patch_size)
    base_rows = int(config.sample_height) // patch
    base_cols = int(config.sample_width) // patch
    dim = int(config.attention_head_dim)
    if config.get("patch_size_t") is None:
        crop = get_resize_crop_region_for_grid((rows, cols), base_cols, base_rows)
        cos, sin = get_3d_rotary_pos_embed(dim, crop, (rows, cols), frames, device=x.device)
    else:
        cos, sin = get_3d_rotary_pos_embed(
            dim, None, (rows, cols), frames, "slice", (base_rows, base_cols), device=x.device
        )
    return {"image_rotary_emb": (cos.to(x.device), sin.to(x.device))}


def _flux_ids(config: Any, grid: tuple[int, int, int], clips: int, x: torch.Tensor):
    """Flux's image ids (0, row, column) per token and zero text ids, as ``FluxPipeline``
    passes them (``txt_ids`` has as many rows as the text; filled in by the adapter)."""
    _, rows, cols = grid
    r, c = torch.meshgrid(
        torch.arange(rows, device=x.device), torch.arange(cols, device=x.device), indexing="ij"
    )
    img_ids = torch.stack([torch.zeros_like(r), r, c], dim=-1).reshape(-1, 3)
    return {"img_ids": img_ids.to(x.dtype)}


_WAN_LIKE_PLAN: dict[str, Any] = {
    "rope": {0: SplitInput(1, 4, True), 1: SplitInput(1, 4, True)},
    "blocks.0": {"hidden_states": SplitInput(1, 3)},
    "proj_out": GatherOutput(1, 3),
}

FAMILIES: dict[str, Family] = {
    "SkyReelsV2Transformer3DModel": Family(
        cp_plan=_WAN_LIKE_PLAN,
        refused={
            "inject_sample_info": (False, "fps conditioning (inject_sample_info)"),
            "num_frame_per_block": (1, "diffusion forcing's causal frame blocks"),
        },
    ),
    "CogVideoXTransformer3DModel": Family(
        cp_plan={
            "": {"image_rotary_emb": [SplitInput(0, 2), SplitInput(0, 2)]},
            "transformer_blocks.0": {"hidden_states": SplitInput(1, 3)},
            "proj_out": GatherOutput(1, 3),
        },
        text_first=True,
        layout="frames_first",
        blocks=("transformer_blocks",),
        refused={"ofs_embed_dim": (None, "image-to-video offsets (ofs_embed_dim)")},
        extra_inputs=_cogvideox_rotary,
    ),
    "HunyuanVideoTransformer3DModel": Family(
        cp_plan={
            "rope": {0: SplitInput(0, 2, True), 1: SplitInput(0, 2, True)},
            "transformer_blocks.0": {"hidden_states": SplitInput(1, 3)},
            "proj_out": GatherOutput(1, 3),
        },
        text_first=False,
        pooled=True,
        guidance=6.0 * 1000.0,
        fills=("pooled_projections",),
        blocks=("transformer_blocks", "single_transformer_blocks"),
        refused={"image_condition_type": (None, "image conditioning (image_condition_type)")},
    ),
    "FluxTransformer2DModel": Family(
        cp_plan={
            "": {
                "hidden_states": SplitInput(1, 3),
                "img_ids": SplitInput(0, 2),
            },
            "proj_out": GatherOutput(1, 3),
        },
        text_first=True,
        layout="tokens",
        patch=(1, 2, 2),
        pooled=True,
        timestep_scale=1.0,
        guidance=3.5,
        blocks=("transformer_blocks", "single_transformer_blocks"),
        extra_inputs=_flux_ids,
    ),
}
"""Declared families, by diffusers class name."""

LAYOUTS = ("video", "frames_first", "tokens")


def family_of(model_class: type) -> Family | None:
    """The declaration of ``model_class``'s family, or None (a class with its own plan)."""
    return FAMILIES.get(model_class.__name__)


def refused_config(model_class: type, config: Any) -> str | None:
    """What a config of ``model_class`` needs that latent files do not hold, or None."""
    family = family_of(model_class)
    for name, (runs, what) in (family.refused if family else {}).items():
        value = config.get(name, runs)
        if value is not None and value != runs:
            return f"{model_class.__name__}: {name} = {value!r}: {what} is not supported"
    return None


def text_inputs(
    family: Family | None, config: Any, context: torch.Tensor, takes_mask: bool
) -> dict[str, Any]:
    """``forward``'s text arguments from the clips' text files ``(B, L, D)``: the
    embeddings; for a ``pooled`` family the pooled projections (row 0), the text mask
    where ``forward`` takes one (``takes_mask``; rows of zeros only are padding), the
    guidance and Flux's text ids."""
    if family is None or not family.pooled:
        return {"encoder_hidden_states": context}
    text = context[:, 1:]
    kwargs: dict[str, Any] = {
        "encoder_hidden_states": text,
        "pooled_projections": context[:, 0, : int(config.pooled_projection_dim)],
    }
    if takes_mask:
        kwargs["encoder_attention_mask"] = (text != 0).any(dim=-1).to(text.dtype)
    if family.guidance is not None and config.get("guidance_embeds"):
        kwargs["guidance"] = text.new_full((text.shape[0],), family.guidance)
    if family.layout == "tokens":
        kwargs["txt_ids"] = text.new_zeros(text.shape[1], 3)
    return kwargs


def joint_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    *,
    text_len: int,
    text_first: bool,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One attention over the text and the group's video, ``(B, H, L + n, D)`` queries
    of this rank (the whole text's and its ``n`` video tokens') in the model's joined
    order. The video keys and values of every rank are joined (``gather(x)``: along the
    sequence, in group order, without padding) to the text's, so every query sees the
    clip's whole joint sequence as in the model's own ``forward``; a key mask
    ``(B, 1, 1, L + S)`` (HunyuanVideo's text mask, built by ``forward`` for the whole
    clip) applies unchanged."""

    def whole(x: torch.Tensor) -> torch.Tensor:
        if text_first:
            return torch.cat([x[:, :, :text_len], gather(x[:, :, text_len:])], dim=2)
        cut = x.shape[2] - text_len
        return torch.cat([gather(x[:, :, :cut]), x[:, :, cut:]], dim=2)

    key, value = whole(key), whole(value)
    if attn_mask is not None and (attn_mask.shape[-1] != key.shape[2] or attn_mask.shape[-2] != 1):
        raise ValueError(
            f"a joint attention mask of shape {tuple(attn_mask.shape)}: only a key mask over "
            f"the whole clip's {key.shape[2]} tokens runs under sequence parallelism"
        )
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, scale=scale
    )
