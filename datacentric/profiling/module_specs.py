"""The one module that derives a :class:`~datacentric.planning.model_specs.ModelSpec`
from any model: no model needs a hand-written spec to train.

Entry points: :func:`named_spec` (a name: an analytic preset or any ``--model`` string),
:func:`spec_of_model` (a built module), :func:`run_spec` (a run's: either, whichever
knows the model), :func:`get_model_spec` and
:func:`list_model_specs` (the analytic presets). Its pure parts stay in ``planning/``
(no torch): the spec type and the paper's STDiT preset
(:mod:`datacentric.planning.model_specs`) and the readers of a transformers or
diffusers config (:mod:`datacentric.planning.config_specs`).

:func:`spec_of_model` reads, in order:

1. one of our configs (:class:`~datacentric.models.llama.LlamaConfig`,
   :class:`~datacentric.models.dit.DiTConfig`): the presets' exact spec
   (:func:`spec_from_model_config`);
2. a transformers or diffusers ``config`` (:mod:`datacentric.planning.config_specs`);
3. otherwise the module itself (a user's ``pkg.module:factory`` model), from its
   parameter shapes: ``num_heads`` (and ``num_kv_heads``) from the model contract, the
   block count from ``blocks``, the width as the input width most of the first block's
   linear layers share, the feed-forward width as the widest output of a linear layer
   reading that width (gated when two layers produce it), the vocabulary from the
   largest ``nn.Embedding`` outside the blocks (tied when an output layer shares its
   weight), ``causal`` attention for a causal LM (``loss_mode == "token"``) and ``full``
   otherwise.

Approximate, by construction, for a module read from its shapes: the FLOPs follow the
generic transformer the widths describe; parameters the generic count misses (norms,
biases, unusual layers) are added as outer parameters, so memory counts every
parameter the model really has. A model can be built on the meta device for this
(no memory is allocated).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from datacentric.models.configs import DiTConfig, LlamaConfig, model_config
from datacentric.planning.config_specs import spec_from_config
from datacentric.planning.model_specs import ModelSpec, stdit_1_1b

if TYPE_CHECKING:  # the presets' specs need no torch; reading a built model does
    from torch import nn

    from datacentric.models.lora import LoraSpec


class UnpricedModelError(ValueError):
    """A model whose cost the analytic model cannot read from it."""


def spec_of_model(model: nn.Module, name: str | None = None) -> ModelSpec:
    """The analytic :class:`ModelSpec` of a built model (see the module doc), with its
    trainable parameter count when some parameters are frozen (LoRA) and the largest ring
    its path runs when it declares one (``max_ring_size``)."""
    spec = _architecture_spec(model, name or type(model).__name__)
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trained < total:
        spec = dataclasses.replace(spec, trainable_params=trained)
    max_ring = getattr(model, "max_ring_size", None)
    if max_ring is not None:  # the model's path runs no larger ring (diffusers generic: 1)
        spec = dataclasses.replace(spec, max_ring_size=int(max_ring))
    return spec


def _architecture_spec(model: nn.Module, name: str) -> ModelSpec:
    config = getattr(model, "config", None)
    if isinstance(config, LlamaConfig | DiTConfig):
        return dataclasses.replace(spec_from_model_config(config, name), name=name)
    if config is not None:
        try:
            return spec_from_config(config, name)
        except ValueError:
            pass  # a config we cannot read: fall back to the parameter shapes
    return spec_from_shapes(model, name)


def spec_from_shapes(model: nn.Module, name: str) -> ModelSpec:
    """The spec of a contract model read from its parameter shapes (approximate)."""
    from torch import nn

    blocks = getattr(model, "blocks", None)
    heads = int(getattr(model, "num_heads", 0) or 0)
    if not blocks or not heads:
        raise UnpricedModelError(
            f"model {name!r}: cannot read its cost without .blocks and .num_heads (the model "
            "contract, docs/models.md); pass a cost model or use --cost-model profile"
        )
    linears = [m for m in blocks[0].modules() if isinstance(m, nn.Linear)]
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
    outside = _outside(model, blocks)
    embeddings = [m for m in outside if isinstance(m, nn.Embedding) and m.embedding_dim == hidden]
    heads_out = [m for m in outside if isinstance(m, nn.Linear) and m.in_features == hidden]
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


def _outside(model: nn.Module, blocks: nn.Module) -> list[nn.Module]:
    inside = {id(m) for m in blocks.modules()}
    return [m for m in model.modules() if id(m) not in inside]


def named_spec(
    name: str, model_args: Mapping[str, Any] | None = None, lora: LoraSpec | None = None
) -> ModelSpec:
    """The spec of the model ``name`` means: an analytic preset
    (:func:`get_model_spec`, e.g. ``llama-7b``) when
    it names one and has no model arguments, else read from the model built on the meta
    device (no memory, no weights read). ``lora``: only its adapters train (their
    count read from the model built on the meta device with them)."""
    args = dict(model_args or {})
    if name in list_model_specs() and not args:
        spec = get_model_spec(name)
    else:
        spec = _meta_spec(name, json.dumps(args, sort_keys=True))
    if lora is None:
        return spec
    trained = _adapter_params(name, json.dumps(args, sort_keys=True), lora)
    return dataclasses.replace(spec, trainable_params=trained)


def run_spec(
    name: str,
    model: nn.Module | None = None,
    model_args: Mapping[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> ModelSpec:
    """The spec a run of ``--model name`` prices: read from the built ``model`` when the
    run has one and ``name`` is not an analytic preset or comes with model arguments or
    adapters (:func:`spec_of_model`), else :func:`named_spec`."""
    custom = name not in list_model_specs() or bool(model_args) or lora is not None
    if model is not None and custom:
        return spec_of_model(model, name)
    return named_spec(name, model_args, lora)


@cache
def _adapter_params(name: str, args_json: str, lora: LoraSpec) -> int:
    from datacentric.models.source import build_from_source, resolve_model

    source = dataclasses.replace(resolve_model(name, json.loads(args_json)), lora=lora)
    model, _ = build_from_source(source, device="meta")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@cache
def _meta_spec(name: str, args_json: str) -> ModelSpec:
    from datacentric.models.source import build_model_named

    model = build_model_named(name, json.loads(args_json), device="meta")
    return spec_of_model(model, name)


def model_identity(name: str, model_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a profile of a model that is not a preset depends on: its class, its config
    (when it has one) and the shapes of its parameters (read on the meta device)."""
    from datacentric.models.source import build_model_named

    args = dict(model_args or {})
    model = build_model_named(name, args, device="meta")
    shapes = [(n, list(p.shape)) for n, p in model.named_parameters()]
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    described = to_dict() if callable(to_dict) else None
    return {
        "class": type(model).__name__,
        "args": args,
        "config_sha256": _sha256_json(described) if described is not None else None,
        "parameter_shapes_sha256": _sha256_json(shapes),
    }


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# --- the analytic presets ---------------------------------------------------------------
#: Operators outside the blocks in one forward + backward (aten calls less views,
#: counted under bf16 autocast as 2 * ops(2 blocks) - ops(4 blocks)).
LLAMA_OUTER_OPS = 62
DIT_OUTER_OPS = 131


def spec_from_model_preset(name: str) -> ModelSpec:
    """The spec of a runnable model preset (:mod:`datacentric.models.presets`).

    Widths, depth and vocabulary come from the preset's config, so the two never drift
    apart; parameters are counted from the layer structure of ``models/llama.py`` and
    ``models/dit.py`` (without building the model, which takes seconds at 13B; a test
    checks the count against the built small models).
    """
    return spec_from_model_config(model_config(name), name)


def spec_from_model_config(config: LlamaConfig | DiTConfig, name: str) -> ModelSpec:
    """The spec of one of our models from its config (see :func:`spec_from_model_preset`)."""
    h, f = config.hidden_size, config.ffn_hidden_size
    if isinstance(config, LlamaConfig):
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


_PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "stdit-1.1b": stdit_1_1b,
    # Our runnable model classes at realistic sizes (see datacentric/models/presets.py):
    # llama-7b/13b follow the LLaMA paper (Touvron et al. 2023, Table 2: 32 layers x 4096,
    # 32 heads; 40 x 5120, 40 heads; SwiGLU 11008 / 13824; 32k vocabulary); dit3d-1b is
    # a full-3D-attention DiT of 28 blocks x 1536 with per-block adaLN.
    "llama-7b": lambda: spec_from_model_preset("llama-7b"),
    "llama-13b": lambda: spec_from_model_preset("llama-13b"),
    "dit3d-1b": lambda: spec_from_model_preset("dit3d-1b"),
    # The small runnable presets profiled on this machine.
    "llama": lambda: spec_from_model_preset("llama"),
    "dit": lambda: spec_from_model_preset("dit"),
}


def list_model_specs() -> list[str]:
    """Names of the analytic model presets."""
    return sorted(_PRESETS)


@cache
def get_model_spec(name: str) -> ModelSpec:
    """The analytic model preset called ``name``."""
    try:
        return _PRESETS[name]()
    except KeyError:
        raise KeyError(f"unknown model {name!r}; choose one of {sorted(_PRESETS)}") from None
