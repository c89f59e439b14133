"""Plain nn.Module reference models; they never import the distributed code.

The attention callable is injected (:data:`AttentionFn`); every model takes a
:class:`PackedBatch` and returns the unreduced per-token loss. The wrappers of an
unmodified transformers or diffusers model (:data:`_LAZY`) need the optional extras and
are imported on first use.
"""

from importlib import import_module
from typing import Any

from datacentric.batch import PackedBatch
from datacentric.models.attention import AttentionFn, AttentionSlot, varlen_attention
from datacentric.models.dit import DiTConfig, VideoDiT
from datacentric.models.llama import Llama, LlamaConfig
from datacentric.models.presets import (
    MODEL_PRESETS,
    ModelFacts,
    ModelPreset,
    build_model,
    list_models,
    model_config,
    model_facts,
    model_from_config,
)
from datacentric.models.source import (
    ModelSource,
    ModelSourceError,
    build_from_source,
    build_model_named,
    parse_model_args,
    resolve_model,
)

# Public name -> the module that defines it (imported on first use: transformers or
# diffusers load only when a wrapper is asked for).
_LAZY = {
    "HFCausalLM": "datacentric.models.hf",
    "UnsupportedModelFeature": "datacentric.models.hf",
    "DiffusersVideoTransformer": "datacentric.models.diffusers_generic",
    "UnsupportedVideoModel": "datacentric.models.diffusers_plan",
}

__all__ = [
    "MODEL_PRESETS",
    "AttentionFn",
    "AttentionSlot",
    "DiTConfig",
    "DiffusersVideoTransformer",
    "HFCausalLM",
    "Llama",
    "LlamaConfig",
    "ModelFacts",
    "ModelPreset",
    "ModelSource",
    "ModelSourceError",
    "PackedBatch",
    "UnsupportedModelFeature",
    "UnsupportedVideoModel",
    "VideoDiT",
    "build_from_source",
    "build_model",
    "build_model_named",
    "list_models",
    "model_config",
    "model_facts",
    "model_from_config",
    "parse_model_args",
    "resolve_model",
    "varlen_attention",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'datacentric.models' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
