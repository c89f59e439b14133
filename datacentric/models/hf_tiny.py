"""The tiny random-weight transformers configs behind ``hf:NAME`` (tests and
``equivalence``): :data:`TINY_CONFIGS`, each filled in from :data:`SMALL_LLAMA` but
GPT-2's. Plain data: :func:`~datacentric.models.hf.tiny_hf_config` makes a config of
one, :func:`~datacentric.models.hf.build_hf_model` builds it."""

from __future__ import annotations

from typing import Any

SMALL_LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "use_cache": False,
}
"""Defaults of :func:`~datacentric.models.hf.build_hf_llama`: a small byte-level Llama
(vocabulary 256)."""


#: the tiny random-weight configs behind ``hf:NAME`` (tests and ``equivalence``); every
#: one has 4 layers, width 64, a byte vocabulary and no dropout
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "num_key_value_heads": 4},
    "mistral": {"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": 16},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2},
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 4,
        "n_head": 4,
        "n_positions": 8192,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "gemma3n": {  # a width per layer (intermediate_size a list), shared KV, a sparse MLP
        "model_type": "gemma3n_text",
        "intermediate_size": [128, 96, 128, 96],
        "head_dim": 16,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 256,
        "num_kv_shared_layers": 2,
        "laurel_rank": 4,
        "altup_num_inputs": 2,
        "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 16,
    },
}
