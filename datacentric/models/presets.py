"""Named model configurations and the one way to build a model from a name.

``llama`` and ``dit`` are small enough for CPU tests and the demo (8 blocks, 4 heads,
so SP sizes 1, 2 and 4 divide the heads). ``llama-7b``, ``llama-13b`` and ``dit3d-1b``
are realistic shapes of the same classes, for the planner and the simulator; build
them on the meta device to inspect them without memory.

:func:`model_facts` gives the numbers an analytic cost model needs (width, layers,
heads, feed-forward width, vocabulary, parameters) as one plain dataclass.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.models.configs import (
    MODEL_PRESETS,
    DiTConfig,
    LlamaConfig,
    ModelPreset,
    PresetConfig,
    list_models,
    model_config,
)
from datacentric.models.dit import VideoDiT
from datacentric.models.layers import count_parameters
from datacentric.models.llama import Llama
from datacentric.models.model_args import ModelSource, check_model_args

__all__ = [  # the configs and the preset table live in models/configs (no torch)
    "MODEL_PRESETS",
    "ModelFacts",
    "ModelPreset",
    "PresetConfig",
    "build_model",
    "list_models",
    "model_config",
    "model_facts",
    "model_from_config",
]


def model_from_config(
    config: PresetConfig, *, attention: AttentionFn = varlen_attention
) -> Llama | VideoDiT:
    """Instantiate the model class that ``config`` describes."""
    if isinstance(config, LlamaConfig):
        return Llama(config, attention=attention)
    if isinstance(config, DiTConfig):
        return VideoDiT(config, attention=attention)
    raise TypeError(f"not a model config: {type(config).__name__}")


def build_model(
    name: str,
    *,
    attention: AttentionFn = varlen_attention,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    **overrides: object,
) -> Llama | VideoDiT:
    """Build preset ``name`` (config fields replaced by ``overrides``).

    Weights are drawn from the global torch RNG: seed it first for reproducible
    weights. ``device="meta"`` builds without allocating memory.
    """
    config = model_config(name, **overrides)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = model_from_config(config, attention=attention)
    return model.to(dtype=dtype)


def build_preset_source(
    source: ModelSource, *, dtype: torch.dtype, device: Any, dataset: Any
) -> Llama | VideoDiT:
    """The preset a ``--model`` source names, its arguments checked against the preset's
    config fields; ``dataset`` sets what the preset follows from the data (latent
    channels, a larger vocabulary), explicit model arguments winning."""
    config = model_config(source.target)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    check_model_args(source, fields, source.target)
    overrides = {**_dataset_overrides(source, dataset), **source.args}
    return build_model(source.target, dtype=dtype, device=device, **overrides)


def _dataset_overrides(source: ModelSource, dataset: Any) -> dict[str, Any]:
    """Preset fields the dataset sets: latent channels, a tokenizer larger than the
    preset's vocabulary (explicit model arguments win)."""
    overrides: dict[str, Any] = {}
    token_dim = getattr(dataset, "token_dim", None)
    if token_dim is not None:
        overrides["in_channels"] = token_dim
    vocab_size = getattr(dataset, "vocab_size", None)
    preset_vocab = getattr(MODEL_PRESETS[source.target].config, "vocab_size", None)
    if vocab_size and preset_vocab is not None and vocab_size > preset_vocab:
        overrides["vocab_size"] = vocab_size
    return overrides


@dataclass(frozen=True)
class ModelFacts:
    """What an analytic cost model needs to know about a model, as plain numbers."""

    name: str
    kind: str
    """``"llama"`` (causal LM) or ``"dit"`` (video diffusion)."""
    loss_mode: str
    """``"token"`` or ``"sample"``: how the runtime normalises the per-token loss."""
    causal: bool
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    ffn_hidden_size: int
    """Inner feed-forward width (SwiGLU has three matrices of this width, GELU two)."""
    ffn_matrices: int
    """Number of ``hidden_size x ffn_hidden_size`` matrices per block (3 SwiGLU, 2 GELU)."""
    vocab_size: int
    """Output classes per token (0 for diffusion)."""
    in_channels: int
    """Regression channels per token (0 for the LM)."""
    num_params: int
    params_per_block: int


def model_facts(name: str, **overrides: object) -> ModelFacts:
    """Plain facts of preset ``name`` (parameters counted on the meta device)."""
    config = model_config(name, **overrides)
    model = build_model(name, device="meta", **overrides)
    block: nn.Module = model.blocks[0]
    is_llama = isinstance(config, LlamaConfig)
    return ModelFacts(
        name=name,
        kind="llama" if is_llama else "dit",
        loss_mode=model.loss_mode,
        causal=is_llama,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        ffn_hidden_size=config.ffn_hidden_size,
        ffn_matrices=3 if is_llama else 2,
        vocab_size=config.vocab_size,
        in_channels=0 if is_llama else config.in_channels,
        num_params=count_parameters(model),
        params_per_block=count_parameters(block),
    )
