"""Plain nn.Module reference models; they never import the distributed code.

The attention callable is injected (:data:`AttentionFn`); every model takes a
:class:`PackedBatch` and returns the unreduced per-token loss.
"""

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

__all__ = [
    "MODEL_PRESETS",
    "AttentionFn",
    "AttentionSlot",
    "DiTConfig",
    "Llama",
    "LlamaConfig",
    "ModelFacts",
    "ModelPreset",
    "ModelSource",
    "ModelSourceError",
    "PackedBatch",
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
