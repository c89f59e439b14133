"""Model specs read from a Hugging Face ``transformers`` or ``diffusers`` config, for the
analytic cost model.

A config is read by attribute only (``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``num_hidden_layers``, ``vocab_size``,
``tie_word_embeddings``, ``max_position_embeddings``, ``model_type``), so this module
imports neither transformers nor torch. What it approximates, and why:

- every decoder layer is ``causal``; a sliding-window layer does less attention work
  than that, so windowed models are priced on the safe (slower, larger) side;
- a width given per layer (a list, such as Gemma3n's ``intermediate_size``) is priced
  at its largest entry for every layer, the same safe side;
- gated MLPs (three matrices) for the Llama family, plain two-matrix MLPs for the
  GPT-2/NeoX/OPT families (:data:`UNGATED_MODEL_TYPES`);
- learned absolute positions (GPT-2 style) are counted as outer parameters;
- saved activations beyond the generic count: the two norms' inputs and the
  un-rotated q and k, ``4 h`` per token, as for our Llama.
"""

from __future__ import annotations

from typing import Any

from datacentric.planning.model_specs import ModelSpec

#: architectures whose MLP has two matrices (up, down), not three
UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi"})
#: architectures with learned absolute position embeddings
LEARNED_POSITION_TYPES = frozenset({"gpt2", "opt"})


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if default is None:
        raise ValueError(f"the config has none of {names}: cannot describe the model")
    return default


def _widest(value: Any) -> int:
    """A width setting as one number: a per-layer list (Gemma3n's ``intermediate_size``,
    one entry per decoder layer) counts as its largest entry, the safe (slower, larger)
    side, as every layer is priced with one width."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("the config gives an empty per-layer width list")
        return max(int(v) for v in value)
    return int(value)


def spec_from_hf_config(config: Any, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` of the decoder-only causal LM that ``config`` describes (a
    per-layer width list priced at its largest entry)."""
    model_type = str(getattr(config, "model_type", "") or "")
    hidden = int(_get(config, "hidden_size", "n_embd"))
    heads = _widest(_get(config, "num_attention_heads", "n_head"))
    kv_heads = _widest(_get(config, "num_key_value_heads", default=heads))
    layers = int(_get(config, "num_hidden_layers", "n_layer"))
    ffn = _widest(_get(config, "intermediate_size", "n_inner", default=4 * hidden))
    vocab = int(_get(config, "vocab_size", default=0))
    positions = 0
    if model_type in LEARNED_POSITION_TYPES:
        positions = int(_get(config, "max_position_embeddings", "n_positions", default=0))
    return ModelSpec(
        name=name or f"hf:{model_type or 'model'}",
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads if kv_heads != heads else 0,
        ffn_hidden=ffn,
        gated_mlp=model_type not in UNGATED_MODEL_TYPES,
        block_kinds=("causal",) * layers,
        vocab_size=vocab,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        extra_outer_params=positions * hidden,
        extra_saved_per_token=4 * hidden,
        source=f"transformers config ({model_type or 'unknown type'})",
    )


#: text tokens a diffusers video model is assumed to cross-attend to (Wan's umT5 prompt
#: length); the true count comes with the data, so cross-attention is approximate
VIDEO_TEXT_TOKENS = 512


def spec_from_diffusers_config(config: Any, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` of a diffusers video transformer ``config`` (Wan, LTX-Video,
    ...: ``num_attention_heads``, ``attention_head_dim``, ``num_layers``, ``in_channels``,
    ``patch_size`` (a tuple, or an int with ``patch_size_t``), the feed-forward width
    ``ffn_dim`` (else 4x the width, as LTX-Video's), the text width ``text_dim`` /
    ``caption_channels`` / ``text_embed_dim``): full 3D attention in every block,
    cross-attention to :data:`VIDEO_TEXT_TOKENS` text tokens (approximate), a plain
    two-matrix MLP, adaLN-single modulation, ``12 h`` extra saved elements per token
    as for our DiT."""
    heads = int(_get(config, "num_attention_heads"))
    hidden = heads * int(_get(config, "attention_head_dim"))
    patch_size = _get(config, "patch_size")
    if isinstance(patch_size, int):
        patch_size = (int(getattr(config, "patch_size_t", None) or 1), patch_size, patch_size)
    patch = 1
    for p in patch_size:
        patch *= int(p)
    single_blocks = int(getattr(config, "num_single_layers", None) or 0)
    return ModelSpec(
        name=name or "diffusers:video",
        hidden=hidden,
        heads=heads,
        ffn_hidden=int(_get(config, "ffn_dim", default=4 * hidden)),
        # HunyuanVideo's and Flux's single-stream blocks follow their dual-stream ones
        block_kinds=("full",) * (int(_get(config, "num_layers")) + single_blocks),
        cross_attn_tokens=VIDEO_TEXT_TOKENS,
        cross_attn_width=int(
            _get(config, "text_dim", "caption_channels", "text_embed_dim", default=hidden)
        ),
        patch_channels=int(_get(config, "in_channels")) * patch,
        adaln_single=True,
        per_sample_block_params=6 * hidden,
        extra_saved_per_token=12 * hidden,
        source="diffusers config (video transformer)",
    )


def spec_from_config(config: Any, name: str | None = None) -> ModelSpec:
    """The spec of a transformers causal LM or a diffusers video transformer config."""
    if getattr(config, "model_type", None) or getattr(config, "n_embd", None):
        return spec_from_hf_config(config, name)
    if getattr(config, "attention_head_dim", None) and getattr(config, "patch_size", None):
        return spec_from_diffusers_config(config, name)
    raise ValueError(
        f"cannot describe a model from a {type(config).__name__}: pass a cost model or a preset"
    )
