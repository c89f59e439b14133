"""The one derivation of a :class:`~datacentric.planning.model_specs.ModelSpec`, from
any model: no model needs a hand-written spec to train.

What it reads (torch-free: a built module is read by duck typing, nothing is imported
from torch or ``models/``):

- an analytic preset written by hand (:data:`HAND_PRESETS`: the paper's STDiT);
- one of our configs (:class:`~datacentric.models.configs.LlamaConfig`,
  :class:`~datacentric.models.configs.DiTConfig`: the runnable presets' exact spec,
  :func:`spec_from_model_config`);
- a Hugging Face ``transformers`` or ``diffusers`` config (:func:`spec_from_config`);
- a built module (:func:`spec_of_model`): its config when it has one of the above, else
  its parameter shapes (:func:`spec_from_shapes`), with its trainable parameter count and
  the largest ring its path runs.

Read off a built module beside its spec, in the same pass: its identity
(:func:`identity_of_model`: class, config and parameter shapes), what a measured
profile's fingerprint records of a model that is not a preset.

A name (``llama-7b``, ``hf:DIR``, ``diffusers:DIR``, ``pkg.module:factory``, a preset
with ``--model-arg``) is turned into one of these by the layer that may build a model:
the cost-model factory (:func:`datacentric.profiling.factory.named_spec`) looks up a
preset's config or builds the model on the meta device, and hands it here.

A transformers config is read by attribute only (``hidden_size``,
``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
``num_hidden_layers``, ``vocab_size``, ``tie_word_embeddings``,
``max_position_embeddings``, ``model_type``). What it approximates, and why:

- every decoder layer is ``causal``; a sliding-window layer does less attention work
  than that, so windowed models are priced on the safe (slower, larger) side;
- a width given per layer (a list, such as Gemma3n's ``intermediate_size``) is priced
  at its largest entry for every layer, the same safe side;
- gated MLPs (three matrices) for the Llama family, plain two-matrix MLPs for the
  GPT-2/NeoX/OPT families (:data:`UNGATED_MODEL_TYPES`);
- learned absolute positions (GPT-2 style) are counted as outer parameters;
- saved activations beyond the generic count: the two norms' inputs and the
  un-rotated q and k, ``4 h`` per token, as for our Llama.

A module read from its parameter shapes (a user's ``pkg.module:factory`` model):
``num_heads`` (and ``num_kv_heads``) from the model contract, the block count from
``blocks``, the width as the input width most of the first block's linear layers share,
the feed-forward width as the widest output of a linear layer reading that width (gated
when two layers produce it), the vocabulary from the largest embedding outside the
blocks (tied when an output layer shares its weight), ``causal`` attention for a causal
LM (``loss_mode == "token"``) and ``full`` otherwise. Approximate, by construction: the
FLOPs follow the generic transformer the widths describe; parameters the generic count
misses (norms, biases, unusual layers) are added as outer parameters, so memory counts
every parameter the model really has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from datacentric.planning.model_specs import ModelSpec

#: the classes a built module is read by, named by module and class (this layer imports
#: neither torch nor ``models/``; :func:`_is_a` matches them as ``isinstance`` does)
LINEAR = "torch.nn.modules.linear.Linear"
EMBEDDING = "torch.nn.modules.sparse.Embedding"
LLAMA_CONFIG = "datacentric.models.configs.LlamaConfig"
DIT_CONFIG = "datacentric.models.configs.DiTConfig"


class UnpricedModelError(ValueError):
    """A model whose cost the analytic model cannot read from it."""


def _is_a(obj: Any, qualified_name: str) -> bool:
    """Whether ``obj``'s class, or a class it derives from, is ``qualified_name``
    (``module.Class``): ``isinstance`` without importing the class."""
    return any(f"{c.__module__}.{c.__qualname__}" == qualified_name for c in type(obj).__mro__)


# --- a built module ------------------------------------------------------------------------
def spec_of_model(model: Any, name: str | None = None) -> ModelSpec:
    """The analytic :class:`ModelSpec` of a built model (a ``torch.nn.Module``, on any
    device, the meta device included; see the module doc), with its trainable parameter
    count when some parameters are frozen (LoRA) and the largest ring its path runs when
    it declares one (``max_ring_size``)."""
    spec = with_trainable(_architecture_spec(model, name or type(model).__name__), model)
    max_ring = getattr(model, "max_ring_size", None)
    if max_ring is not None:  # the model's path runs no larger ring (diffusers generic: 1)
        spec = dataclasses.replace(spec, max_ring_size=int(max_ring))
    return spec


def identity_of_model(model: Any, args: dict[str, Any]) -> dict[str, Any]:
    """What a measured profile of a built ``model`` (made with the model arguments
    ``args``, without adapters) depends on: its class, its config (when it has one) and
    the shapes of its parameters, as hashes (the fingerprint of
    :mod:`datacentric.profiling.store`)."""
    shapes = [(n, list(p.shape)) for n, p in model.named_parameters()]
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    described = to_dict() if callable(to_dict) else None
    return {
        "class": type(model).__name__,
        "args": dict(args),
        "config_sha256": json_sha256(described) if described is not None else None,
        "parameter_shapes_sha256": json_sha256(shapes),
    }


def json_sha256(value: Any) -> str:
    """The SHA-256 (hex) of ``value`` as canonical JSON: keys sorted, ``json.dumps``'
    default separators and ASCII escapes, a value JSON has no form for as its ``str`` (a
    config's dtype). Saved profiles' fingerprints and identities are these digests:
    any change of form changes every one of them."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def with_trainable(spec: ModelSpec, model: Any) -> ModelSpec:
    """``spec`` with the trainable parameter count of the built ``model`` when some of its
    parameters are frozen (LoRA: only the adapters train)."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dataclasses.replace(spec, trainable_params=trained) if trained < total else spec


def _architecture_spec(model: Any, name: str) -> ModelSpec:
    config = getattr(model, "config", None)
    if _is_a(config, LLAMA_CONFIG) or _is_a(config, DIT_CONFIG):
        return dataclasses.replace(spec_from_model_config(config, name), name=name)
    if config is not None:
        try:
            return spec_from_config(config, name)
        except ValueError:
            pass  # a config we cannot read: fall back to the parameter shapes
    return spec_from_shapes(model, name)


def spec_from_shapes(model: Any, name: str) -> ModelSpec:
    """The spec of a contract model read from its parameter shapes (approximate)."""
    blocks = getattr(model, "blocks", None)
    heads = int(getattr(model, "num_heads", 0) or 0)
    if not blocks or not heads:
        raise UnpricedModelError(
            f"model {name!r}: cannot read its cost without .blocks and .num_heads (the model "
            "contract, docs/models.md); pass a cost model or use --cost-model profile"
        )
    linears = [m for m in blocks[0].modules() if _is_a(m, LINEAR)]
    if not linears:
        raise UnpricedModelError(
            f"model {name!r}: its first block has no nn.Linear layers to read widths from; "
            "use --cost-model profile"
        )
    hidden = Counter(m.in_features for m in linears).most_common(1)[0][0]
    widths = Counter(m.out_features for m in linears if m.in_features == hidden)
    ffn = max(widths) if max(widths) > hidden else 4 * hidden
    gated = widths.get(ffn, 0) >= 2 and ffn > hidden
    if hidden % heads:
        raise UnpricedModelError(
            f"model {name!r}: width {hidden} read from its first block is not divisible by "
            f"its {heads} heads; use --cost-model profile"
        )
    kv_heads = int(getattr(model, "num_kv_heads", 0) or 0)
    inside = {id(m) for m in blocks.modules()}
    outside = [m for m in model.modules() if id(m) not in inside]
    embeddings = [m for m in outside if _is_a(m, EMBEDDING) and m.embedding_dim == hidden]
    heads_out = [m for m in outside if _is_a(m, LINEAR) and m.in_features == hidden]
    vocab = max((m.out_features for m in heads_out), default=0)  # the output head's width
    tied = any(m.weight is e.weight for m in heads_out for e in embeddings)
    spec = ModelSpec(
        name=name,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads if kv_heads not in (0, heads) else 0,
        ffn_hidden=ffn,
        gated_mlp=gated,
        block_kinds=(("causal" if model.loss_mode == "token" else "full"),) * len(blocks),
        vocab_size=vocab,
        tie_embeddings=tied,
        extra_saved_per_token=4 * hidden,
        source=f"parameter shapes of {type(model).__name__} (approximate)",
    )
    total = sum(p.numel() for p in model.parameters())
    return dataclasses.replace(spec, extra_outer_params=max(0, total - spec.num_params))


# --- our configs (the runnable presets) ----------------------------------------------------
#: Operators outside the blocks in one forward + backward (aten calls less views,
#: counted under bf16 autocast as 2 * ops(2 blocks) - ops(4 blocks)).
LLAMA_OUTER_OPS = 62
DIT_OUTER_OPS = 131


def spec_from_model_config(config: Any, name: str) -> ModelSpec:
    """The spec of one of our models from its config (a
    :class:`~datacentric.models.configs.LlamaConfig` or
    :class:`~datacentric.models.configs.DiTConfig`).

    Widths, depth and vocabulary come from the config, so a preset's spec and its model
    never drift apart; parameters are counted from the layer structure of
    ``models/llama.py`` and ``models/dit.py`` (without building the model, which takes
    seconds at 13B; a test checks the count against the built small models).
    """
    h, f = config.hidden_size, config.ffn_hidden_size
    if _is_a(config, LLAMA_CONFIG):
        return ModelSpec(
            name=name,
            hidden=h,
            heads=config.num_heads,
            ffn_hidden=f,
            gated_mlp=True,
            block_kinds=("causal",) * config.num_layers,
            vocab_size=config.vocab_size,
            per_sample_block_params=2 * h,  # the two RMSNorm weights
            extra_outer_params=h,  # final RMSNorm
            # approximate, read from models/common.py: each RMSNorm also keeps its
            # normalised value before the weight (2 x h), the rotary embedding keeps the
            # un-rotated q and k (2h).
            extra_saved_per_token=4 * h,
            outer_ops=LLAMA_OUTER_OPS,
            source=f"datacentric.models.presets {name!r}",
        )
    c, freq = config.in_channels, config.timestep_freq_dim
    return ModelSpec(
        name=name,
        hidden=h,
        heads=config.num_heads,
        ffn_hidden=f,
        block_kinds=("full",) * config.num_layers,
        patch_channels=c,
        # per-block adaLN MLP (6h x h, runs once per sample) and the biases of q, k, v,
        # o, both feed-forward layers and adaLN
        per_sample_block_params=6 * h * h + 4 * h + f + h + 6 * h,
        # generic count has patch in/out (2ch), timestep MLP (256h + h^2); add the
        # actual frequency width, the final adaLN (2h^2 + 2h) and biases
        extra_outer_params=(freq - 256) * h + 2 * h * h + 2 * h + h + 2 * h + c,
        # approximate, read from models/dit.py: the per-token gathered modulation rows
        # (6h), both LayerNorm outputs kept for the scale product (2h), the un-rotated
        # q and k (2h), the attention and MLP outputs kept for their gates (2h).
        extra_saved_per_token=12 * h,
        per_token_modulation=6 * h,  # shift, scale, gate of attention and MLP
        outer_per_token_modulation=2 * h,  # final adaLN: shift, scale
        outer_ops=DIT_OUTER_OPS,
        source=f"datacentric.models.presets {name!r}",
    )


# --- analytic presets written by hand ------------------------------------------------------
def stdit_1_1b() -> ModelSpec:
    """Open-Sora v1.2's STDiT3-XL/2, the paper's video model (no runnable model here)."""
    # Open-Sora v1.2 STDiT3-XL/2 (hpcaitech/Open-Sora, opensora/models/stdit/stdit3.py, and
    # Open-Sora v1.2 bucket configuration): depth 28 means 28 *pairs* of blocks, a spatial
    # block then a temporal block, 56 blocks in all; this is what makes the published 1.1B
    # (56 blocks x 16 h^2 = 1.19e9). hidden 1152, 16 heads, MLP ratio 4 (GELU), T5 captions
    # of 300 tokens x 4096 projected to 1152, adaLN-single, latent 4 channels, patch 1x2x2.
    return ModelSpec(
        name="stdit-1.1b",
        hidden=1152,
        heads=16,
        ffn_hidden=4 * 1152,
        block_kinds=("spatial", "temporal") * 28,
        cross_attn_tokens=300,
        cross_attn_width=4096,
        patch_channels=4 * 1 * 2 * 2,
        adaln_single=True,
        sp_layout="frame-sharded",
        source="Open-Sora v1.2 STDiT3-XL/2 (stdit3.py) and its bucket configuration",
    )


#: The analytic presets without a runnable model, by name; the runnable presets
#: (``datacentric.models.configs.MODEL_PRESETS``) are read from their configs.
HAND_PRESETS: dict[str, Callable[[], ModelSpec]] = {"stdit-1.1b": stdit_1_1b}


# --- transformers and diffusers configs ----------------------------------------------------
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
