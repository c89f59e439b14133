"""Plain nn.Module reference models; they never import the distributed code.

The attention callable is injected (:data:`AttentionFn`); every model takes a
:class:`PackedBatch` and returns the unreduced per-token loss. Every public name is
imported on first use (:data:`_LAZY`): ``datacentric.models.configs`` (the configs and
presets, no torch) loads without torch, and the wrappers of an unmodified transformers
or diffusers model load their optional extras only when asked for.
"""

from datacentric.lazy_exports import lazy_exports

# Public name -> the module that defines it.
_LAZY = {
    "PackedBatch": "datacentric.batch",
    "AttentionFn": "datacentric.models.attention",
    "AttentionSlot": "datacentric.models.attention",
    "varlen_attention": "datacentric.models.attention",
    "DiTConfig": "datacentric.models.configs",
    "LlamaConfig": "datacentric.models.configs",
    "MODEL_PRESETS": "datacentric.models.configs",
    "ModelPreset": "datacentric.models.configs",
    "list_models": "datacentric.models.configs",
    "model_config": "datacentric.models.configs",
    "VideoDiT": "datacentric.models.dit",
    "Llama": "datacentric.models.llama",
    "ModelFacts": "datacentric.models.presets",
    "build_model": "datacentric.models.presets",
    "model_facts": "datacentric.models.presets",
    "model_from_config": "datacentric.models.presets",
    "ModelSource": "datacentric.models.source",
    "ModelSourceError": "datacentric.models.model_args",
    "build_from_source": "datacentric.models.source",
    "build_model_named": "datacentric.models.source",
    "parse_model_args": "datacentric.models.model_args",
    "resolve_model": "datacentric.models.source",
    "HFCausalLM": "datacentric.models.hf",
    "UnsupportedModelFeature": "datacentric.models.hf_attention",
    "DiffusersVideoTransformer": "datacentric.models.diffusers_generic",
    "UnsupportedVideoModel": "datacentric.models.diffusers_plan",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
