"""Hugging Face ``transformers`` causal LMs under our model contract.

:class:`HFCausalLM` wraps an unmodified decoder-only ``*ForCausalLM`` (built
from a config, randomly initialised: nothing is downloaded) so that the
data-centric runtime can train it like our own models:

- ``blocks`` are the model's decoder layers, found wherever the architecture keeps
  them (``model.layers``, GPT-2's ``transformer.h``, NeoX's ``gpt_neox.layers``...);
  per-block recomputation wraps them;
- ``num_heads``/``num_kv_heads`` are the query and key/value head counts (Ulysses
  splits heads across a group; grouped key/value heads are repeated only as far as
  a group needs to split them);
- ``loss_mode`` is ``"token"`` (mean over the global batch's loss tokens);
- ``set_attention(fn)`` routes every attention layer through an
  :data:`~datacentric.models.attention.AttentionFn`. The routing goes through
  transformers' attention interface: :func:`packed_attention_forward` is
  registered once as the ``"datacentric"`` implementation
  (``AttentionInterface.register``) and the model's
  ``config._attn_implementation`` is switched to it; the callable and the
  packed layout travel to it as keyword arguments of the model's forward;
- ``forward(batch)`` returns the unreduced next-token cross-entropy ``(S_local,)``.

Packed sequences: a :class:`PackedBatch` (or its SP shard) becomes a batch of
one row of ``S_local`` tokens. ``position_ids`` are the batch's own, global
positions within each sample even on a shard, so RoPE is computed by the model
from them exactly as in one process. No attention mask is built ("datacentric"
has no entry in transformers' mask interface); sample boundaries are
``cu_seqlens`` over the full packed sequence, which the AttentionFn uses.

Never silently wrong: a feature this path cannot run exactly is refused at
construction with :class:`UnsupportedModelFeature` naming it (:func:`check_supported`:
cross-attention, ALiBi, attention-logit softcapping, GPT-Neo local attention, chunked
attention, row-index temperature tuning, rotary scalings that depend on the sequence
length at run time such as LongRoPE and dynamic NTK, dropout on attention
probabilities, and every model that computes attention outside transformers' attention
interface, or whose ``layer_types`` include layers that are not attention). At run time,
attention sinks, a mask the layer builds itself and layers that drop the forward's keyword
arguments are refused (:func:`packed_attention_forward`); :func:`small_copy` lets the check
before ranks start run the model to find them. Sliding windows (Mistral, Qwen2, Gemma,
Phi-3) are run exactly: the layer's ``sliding_window`` reaches the attention callable as
its ``window``; so is multi-head latent attention (value heads of another width than
query/key heads, DeepSeek-V3). With ``output_router_logits=True`` (Mixtral, OLMoE,
Qwen2/3-MoE) the router's auxiliary loss is trained per sample
(:meth:`HFCausalLM.router_aux_loss`), at SP size 1 only.

Dropout outside attention (GPT-2's ``resid_pdrop``/``embd_pdrop``, ...) runs as the
model defines it while the module is in training mode: masks come from the torch
random stream of the rank that runs the token (recomputation replays the same masks).
``model.eval()`` turns it off; ``datacentric equivalence`` runs that way.

This module does not import the distributed package.

Where each part lives: the attention implementation registered in transformers and what
it refuses at run time (:func:`packed_attention_forward`, :class:`UnsupportedModelFeature`)
in :mod:`~datacentric.models.hf_attention`; where an architecture keeps its decoder layers
(:func:`decoder_layers`) in :mod:`~datacentric.models.hf_layers`; the loss tokens' sums a
forward counts (:func:`loss_token_sums`) in :mod:`~datacentric.models.token_metrics`;
how the wrapper runs a packed batch (its forward, logits and router loss, with the shape
legend) in :mod:`~datacentric.models.hf_forward`; the tiny configs behind ``hf:NAME``
(:data:`TINY_CONFIGS`, :data:`SMALL_LLAMA`) in :mod:`~datacentric.models.hf_tiny`.
Here: :class:`HFCausalLM` and its construction, what a config is refused for
(:func:`check_supported`), and the builds of an ``hf:`` source; every name this module
held before is still importable from it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from datacentric.models.attention import AttentionFn, AttentionSlot, varlen_attention
from datacentric.models.hf_attention import (
    ATTENTION_NAME,
    REFUSED_KWARGS,
    UnsupportedModelFeature,
    packed_attention_forward,
    register_attention,
)
from datacentric.models.hf_forward import PackedCausalLM
from datacentric.models.hf_layers import _layer_signature, decoder_layers
from datacentric.models.hf_tiny import SMALL_LLAMA, TINY_CONFIGS
from datacentric.models.lora import unwrap_peft
from datacentric.models.model_args import (
    ModelSource,
    ModelSourceError,
    check_loaded_weights,
    check_model_args,
    weight_files,
)
from datacentric.models.token_metrics import loss_token_sums
from datacentric.regular_files import check_regular, read_json_file

try:
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.hf needs transformers: pip install 'datacentric[hf]'"
    ) from _error

#: every public name this module held, those that moved included (each the object of its home)
__all__ = [
    "ATTENTION_DROPOUT_SETTINGS",
    "ATTENTION_LAYER_TYPES",
    "ATTENTION_NAME",
    "HFCausalLM",
    "POSITION_LOCAL_ROPE_TYPES",
    "REFUSED_KWARGS",
    "ROUTER_AUX_MODELS",
    "Refusal",
    "SMALL_LLAMA",
    "TINY_CONFIGS",
    "UnsupportedModelFeature",
    "attention_heads",
    "build_hf_llama",
    "build_hf_model",
    "build_hf_source",
    "check_supported",
    "check_weight_files",
    "decoder_layers",
    "folder_config",
    "loss_token_sums",
    "packed_attention_forward",
    "register_attention",
    "rope_types",
    "small_copy",
    "source_config",
    "tiny_hf_config",
]


#: Mixture-of-experts models whose own loss with ``output_router_logits=True`` adds
#: ``router_aux_loss_coef * load_balancing_loss_func(router_logits, num_experts,
#: num_experts_per_tok, attention_mask)``: the term :meth:`HFCausalLM.router_aux_loss`
#: computes per sample
ROUTER_AUX_MODELS = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe")


#: ``config.layer_types`` entries whose layers attend through transformers' attention
#: interface; any other (``linear_attention``, ``mamba``, ``conv``...) mixes tokens in
#: the model's own code, across the whole packed row
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


class HFCausalLM(PackedCausalLM, AttentionSlot, nn.Module):
    """A transformers decoder-only causal LM with our model contract.

    ``hf_model`` is an unmodified decoder-only ``*ForCausalLM`` (Llama, Mistral,
    Qwen2/3, Gemma2/3, Phi-3, GPT-2, GPT-NeoX, ...). Its parameters are this
    module's, under the prefix ``hf.``. ``attention`` is the
    :data:`AttentionFn` to start with (single-process varlen attention).
    """

    loss_mode = "token"

    def __init__(self, hf_model: nn.Module, attention: AttentionFn = varlen_attention) -> None:
        super().__init__()
        hf_model = unwrap_peft(hf_model)  # a peft.PeftModel: the model it adapts, in place
        check_supported(hf_model.config, type(hf_model).__name__, type(hf_model))
        self.hf = hf_model
        self.config = hf_model.config
        self.num_heads = int(self.config.num_attention_heads)
        self.num_kv_heads = int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)
        self.blocks = decoder_layers(hf_model)
        self.router_aux_coef: float | None = None
        """The router auxiliary loss coefficient when ``output_router_logits=True``."""
        self.max_sp_size: int | None = None
        """The largest SP size this model runs exactly (``None``: any its heads allow)."""
        self.token_sums: torch.Tensor | None = None
        """While set (by the runtime, a ``(3,)`` float64 tensor), each forward adds to it
        :func:`loss_token_sums` of its loss tokens (no gradient)."""
        if getattr(self.config, "output_router_logits", False):
            self.router_aux_coef = float(hf_model.router_aux_loss_coef)
            self.max_sp_size = 1
            self.max_sp_size_reason = (
                "output_router_logits=True (the router's auxiliary loss of a sample needs "
                "all of its tokens on one rank); set output_router_logits=False to shard "
                "sequences"
            )
        register_attention()
        self.hf.set_attn_implementation(ATTENTION_NAME)
        self.set_attention(attention)


#: rotary scalings whose angles are a function of each token's own position for a fixed
#: config: transformers computes their inverse frequencies once, from the config, when the
#: rotary embedding is built (``ROPE_INIT_FUNCTIONS[type](config, device)`` with no
#: sequence length), and its ``dynamic_rope_update`` recomputes them at run time only for
#: the ``dynamic`` types and ``longrope``. So a token's angles are ``position * inv_freq``
#: (times a constant attention factor), the same packed, sharded or alone.
POSITION_LOCAL_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


#: why a rotary scaling outside :data:`POSITION_LOCAL_ROPE_TYPES` is refused, per type
_ROPE_REASONS = {
    "longrope": "LongRoPE rotary scaling switches between its short and long factors on the "
    "largest position in the packed row or shard, so a sample's angles depend on the "
    "samples packed with it",
    "dynamic": "dynamic NTK rotary scaling recomputes its frequencies from the largest "
    "position in the packed row or shard, so a sample's angles depend on the samples "
    "packed with it",
}


#: config settings of dropout on attention probabilities (our attention kernels run none)
ATTENTION_DROPOUT_SETTINGS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")


def rope_types(config: Any) -> list[str]:
    """The rotary scaling types a config declares (``rope_parameters`` in transformers 5,
    ``rope_scaling`` before; one dict, or one per layer type), ``"default"`` for none."""
    found = []
    for name in ("rope_parameters", "rope_scaling"):
        value = getattr(config, name, None)
        if not isinstance(value, dict):
            continue
        entries = [v for v in value.values() if isinstance(v, dict)] or [value]
        for entry in entries:
            found.append(str(entry.get("rope_type", entry.get("type", "default"))))
    return sorted(set(found)) or ["default"]


def check_supported(config: Any, what: str, model_class: type | None = None) -> None:
    """Raise :class:`UnsupportedModelFeature` for a model this path cannot run exactly,
    naming the feature: cross-attention, ALiBi, attention-logit softcapping, GPT-Neo's
    local attention, chunked attention and row-index temperature tuning (Llama4), a
    rotary scaling that is not position-local, dropout on attention probabilities, key/value
    heads that do not divide the query heads, and (``model_class`` given) a model that
    computes attention in its own code instead of through transformers' attention
    interface; after the score features, a config that names no attention heads
    (:func:`attention_heads`). Cheap: reads the config only (call it before building the
    weights)."""
    refusal = next(_score_refusals(config), None)
    if refusal is None:
        attention_heads(config, what)
        refusal = next(_layer_refusals(config, model_class), None)
    if refusal is not None:
        feature, fix = refusal
        raise UnsupportedModelFeature(
            f"{what}: {feature} cannot run exactly with packed sequence-parallel attention; {fix}"
        )


Refusal = tuple[str, str]
"""A feature this path cannot run exactly, and how to fix it."""


def attention_heads(config: Any, what: str) -> int:
    """The attention heads of a causal LM's config (``num_attention_heads``, or the name
    its ``attribute_map`` gives it); :class:`UnsupportedModelFeature` naming the family
    for a config with none: a recurrent or state-space model (RWKV, xLSTM, Mamba), a
    composite model whose heads are in sub-configs (a multimodal model's
    ``text_config``, a byte-level LM's encoder, decoder and global transformer), or heads
    that vary per layer."""
    family = str(getattr(config, "model_type", "") or type(config).__name__)
    try:
        heads = getattr(config, "num_attention_heads", None)
    except Exception as err:  # noqa: BLE001 - transformers' per-layer configs refuse the read
        raise UnsupportedModelFeature(
            f"{what}: its attention heads are set per layer ({family}: "
            f"{str(err).splitlines()[0][:120]}); data-centric parallel splits every layer's "
            "heads alike: use a model with one head count"
        ) from None
    if isinstance(heads, int) and heads > 0:
        return heads
    subs = [
        name
        for name, sub in sorted(vars(config).items())
        if isinstance(getattr(sub, "num_attention_heads", None), int)
    ]
    if subs:
        raise UnsupportedModelFeature(
            f"{what}: a composite model ({family}): its attention heads are in its "
            f"sub-configs ({', '.join(subs)}), several models in one; data-centric parallel "
            "splits one decoder's attention: train a decoder-only causal LM (for a "
            "multimodal model, its language model saved on its own)"
        )
    raise UnsupportedModelFeature(
        f"{what}: not an attention model ({family}): data-centric parallel splits attention, "
        "and its config names no attention heads (num_attention_heads); use a transformer "
        "causal LM"
    )


def _score_refusals(config: Any) -> Iterator[Refusal]:
    """What in ``config`` changes the attention scores beyond what our kernels compute:
    cross-attention, position biases, softcapping, windows and chunks, temperature by
    row index, a rotary scaling that is not position-local, attention dropout."""
    model_type = str(getattr(config, "model_type", ""))
    if getattr(config, "is_encoder_decoder", False):
        yield "encoder-decoder attention (is_encoder_decoder=True)", "use a decoder-only LM"
    if getattr(config, "add_cross_attention", False):
        yield "cross-attention (add_cross_attention=True)", "use a decoder-only causal LM"
    attn_config = getattr(config, "attn_config", None)  # MPT keeps ALiBi here
    if (
        model_type == "bloom"
        or getattr(config, "alibi", False)
        or getattr(attn_config, "alibi", False)
    ):
        yield (
            f"ALiBi position biases ({model_type or 'alibi=True'}: a bias added to the "
            "attention scores, which our attention kernels do not compute)",
            "use a model with rotary or learned positions",
        )
    if getattr(config, "attn_logit_softcapping", None) is not None:
        yield (
            f"attention-logit softcapping (attn_logit_softcapping="
            f"{config.attn_logit_softcapping!r}, a tanh on the scores inside attention)",
            "set attn_logit_softcapping=None",
        )
    if "local" in (getattr(config, "attention_layers", None) or ()):
        yield (
            f"GPT-Neo local attention (attention_types with 'local' layers, window_size="
            f"{getattr(config, 'window_size', None)!r}, computed in the model's own code)",
            "use a model that routes attention through transformers' attention interface",
        )
    if getattr(config, "attention_chunk_size", None) is not None:
        yield (
            f"chunked attention (attention_chunk_size={config.attention_chunk_size!r}: "
            "tokens attend only within fixed chunks of the row)",
            "set attention_chunk_size=None",
        )
    if getattr(config, "attn_temperature_tuning", False):
        yield (
            "attention temperature tuning (attn_temperature_tuning=True: queries of NoPE "
            "layers are scaled by the token's index in the packed row, not its position in "
            "its sample)",
            "set attn_temperature_tuning=False",
        )
    for rope_type in rope_types(config):
        if rope_type not in POSITION_LOCAL_ROPE_TYPES:
            reason = _ROPE_REASONS.get(
                rope_type, "a rotary scaling not known to depend on each token's position only"
            )
            yield (
                f"rope_type={rope_type!r} ({reason})",
                f"use one of {', '.join(POSITION_LOCAL_ROPE_TYPES)}",
            )
    for name in ATTENTION_DROPOUT_SETTINGS:
        if float(getattr(config, name, 0.0) or 0.0) > 0.0:
            yield (
                f"dropout on attention probabilities ({name}={getattr(config, name)!r}; our "
                "attention kernels apply none)",
                f"set {name}=0 (dropout outside attention runs: docs/huggingface.md)",
            )


def _layer_refusals(config: Any, model_class: type | None) -> Iterator[Refusal]:
    """What in ``config`` (and ``model_class``) mixes tokens outside transformers'
    attention interface or cannot be split exactly: other layer types, key/value heads
    that do not divide the query heads, an unknown router loss, no attention backends."""
    model_type = str(getattr(config, "model_type", ""))
    other_layers = sorted(
        {str(t) for t in getattr(config, "layer_types", None) or ()} - set(ATTENTION_LAYER_TYPES)
    )
    if other_layers and "chunked_attention" not in other_layers:
        yield (
            f"layer_types {', '.join(map(repr, other_layers))} (token mixing computed in the "
            "model's own code, not through transformers' attention interface, so it runs "
            "across the samples of a packed row)",
            f"use a model whose layers are all {' or '.join(ATTENTION_LAYER_TYPES)}",
        )
    heads = int(config.num_attention_heads)  # present: attention_heads checked it first
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        yield (
            f"num_key_value_heads={kv_heads} (not a divisor of the {heads} attention heads)",
            f"use a divisor of {heads}",
        )
    if getattr(config, "output_router_logits", False) and model_type not in ROUTER_AUX_MODELS:
        yield (
            f"output_router_logits=True on {model_type or 'this model'} (a router auxiliary "
            "loss whose per-sample form is known only for "
            f"{', '.join(ROUTER_AUX_MODELS)})",
            "set output_router_logits=False (the loss is then cross-entropy alone)",
        )
    compatible = getattr(model_class, "is_backend_compatible", None)
    if model_class is not None and (compatible is None or not compatible()):
        yield (
            "attention computed in the model's own code, not through transformers' "
            f"attention interface ({model_class.__name__} does not support attention "
            "backends, so no attention callable can replace it)",
            "use an architecture that supports attention backends (Llama, Mistral, Qwen2/3, "
            "Gemma2/3, Phi-3, GPT-2, GPT-NeoX, OLMo, Starcoder2, ...)",
        )


def tiny_hf_config(name: str, **config_overrides: Any) -> Any:
    """The transformers config of the tiny model ``name`` of :data:`TINY_CONFIGS`
    (updated with ``config_overrides``): what :func:`build_hf_model` builds, and what an
    independent reference builds again unmodified."""
    if name not in TINY_CONFIGS:
        raise KeyError(f"unknown Hugging Face model {name!r}; choose one of {sorted(TINY_CONFIGS)}")
    values = dict(TINY_CONFIGS[name])
    model_type = values.pop("model_type")
    if model_type != "gpt2":
        values = {**SMALL_LLAMA, **values}
    values.update(config_overrides)
    return AutoConfig.for_model(model_type, **values)


def build_hf_model(
    name: str,
    *,
    attention: AttentionFn = varlen_attention,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **config_overrides: Any,
) -> HFCausalLM:
    """A tiny randomly initialised transformers causal LM named in :data:`TINY_CONFIGS`
    (``"mistral"``, ``"qwen2"``, ``"gpt2"``, ...), wrapped in :class:`HFCausalLM`.

    Weights come from the global torch RNG: seed it for the same model on every
    rank. Nothing is downloaded. The config is checked (:func:`check_supported`)
    before any weight is drawn.
    """
    config = tiny_hf_config(name, **config_overrides)
    check_supported(config, f"hf:{name}", AutoModelForCausalLM._model_mapping[type(config)])
    hf_model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    model = HFCausalLM(hf_model, attention=attention)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def build_hf_source(source: ModelSource, *, dtype: torch.dtype, device: Any) -> HFCausalLM:
    """The model an ``hf:`` source names: a tiny name of :data:`TINY_CONFIGS`, else its
    folder's config (``--model-arg`` values set on it), its pretrained safetensors
    weights read unless ``device`` is ``meta`` or the folder holds none. What the build
    reads is read and checked first, in one pass (:func:`source_config`, then the weight
    files' headers), before any weight is drawn or loaded."""
    config = source_config(source)
    pretrained = source.folder is not None and str(device) != "meta" and source.has_weights
    if pretrained:
        check_weight_files(source)
    if source.folder is None:  # a tiny name: build_hf_model sets the arguments on its config
        with torch.device(device) if device is not None else contextlib.nullcontext():
            return build_hf_model(source.target, dtype=dtype, **source.args)
    if pretrained:
        hf_model, loading = AutoModelForCausalLM.from_pretrained(
            source.folder,
            config=config,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, naming the tensor
            **_dtype_kwarg(dtype),
        )
        check_loaded_weights(source.name, source.folder, type(hf_model).__name__, loading)
    else:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            hf_model = AutoModelForCausalLM.from_config(
                config, trust_remote_code=False, **_dtype_kwarg(dtype)
            )
    model = HFCausalLM(hf_model)
    return model.to(device=device, dtype=dtype) if device is not None else model.to(dtype=dtype)


def source_config(source: ModelSource) -> Any:
    """The transformers config an ``hf:`` source names, its model arguments checked
    against it: a tiny name's (:func:`tiny_hf_config`, the arguments not set yet:
    :func:`build_hf_model` sets them), else its folder's (:func:`folder_config`) with the
    arguments set and the cache off."""
    if source.folder is None:
        base = tiny_hf_config(source.target)
        check_model_args(source, base.to_dict(), f"hf:{source.target}'s config")
        return base
    config = folder_config(source)
    check_model_args(source, config.to_dict(), f"{source.folder}/config.json")
    for key, value in source.args.items():
        setattr(config, key, value)
    config.use_cache = False
    return config


def check_weight_files(source: ModelSource) -> None:
    """Every safetensors file of the folder has a readable header (else one line naming
    it, not the library's error)."""
    from safetensors import safe_open

    for file in weight_files(source.folder):
        check_regular(file)  # safetensors' own open would block on a FIFO
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: a bad file
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            raise ModelSourceError(
                f"model {source.name!r}: {file} is not a readable safetensors file ({why}); "
                "save the model again with save_pretrained"
            ) from None


def folder_config(source: ModelSource) -> Any:
    """The transformers config of an ``hf:DIR`` folder, its code never run (nor asked
    about): a ``model_type`` transformers does not ship is refused, naming it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    file = source.folder / "config.json"
    try:
        values = read_json_file(file, error=ModelSourceError)
    except ModelSourceError as err:
        raise ModelSourceError(f"model {source.name!r}: {err}") from None
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        code = values.get("auto_map")
        raise ModelSourceError(
            f"model {source.name!r}: {file} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know"
            + (
                " (the folder's auto_map names its own code, which datacentric never runs)"
                if code
                else ""
            )
            + "; save the model as a type transformers ships"
        )
    try:
        return AutoConfig.from_pretrained(
            source.folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # noqa: BLE001 - transformers' checks raise several types
        why = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()[:200]
        raise ModelSourceError(
            f"model {source.name!r}: {file}: not a usable config ({why})"
        ) from None


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """transformers' dtype keyword: ``dtype`` since 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def build_hf_llama(
    *,
    attention: AttentionFn = varlen_attention,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **config_overrides: Any,
) -> HFCausalLM:
    """A randomly initialised ``transformers.LlamaForCausalLM`` wrapped in :class:`HFCausalLM`.

    The config is :data:`SMALL_LLAMA` updated with ``config_overrides`` (any
    ``LlamaConfig`` field). Weights come from the global torch RNG: seed it for
    the same model on every rank. Nothing is downloaded.
    """
    return build_hf_model(
        "llama", attention=attention, device=device, dtype=dtype, **config_overrides
    )


def small_copy(model: HFCausalLM) -> HFCausalLM:
    """A randomly initialised CPU copy of ``model`` (which may live on the meta device)
    that keeps every type of decoder layer: its first layers, up to and including the
    first layer of each distinct type (:func:`_layer_signature`), at full width.

    The check before ranks start runs it forward: a refusal that compares numbers (an
    attention sink, a mask of the layer's own, a layer that drops the packed layout)
    shows only when the model runs. Layer types are decided by the layer's index
    (``layer_types``, ``decoder_sparse_step``, ``first_k_dense_replace``...), so the
    copy's layers are the same types as the model's first layers.
    """
    config = copy.deepcopy(model.hf.config)
    seen: dict[tuple, int] = {}
    for index, layer in enumerate(model.blocks):
        seen.setdefault(_layer_signature(config, layer, index), index)
    keep = max(seen.values()) + 1
    count = int(config.num_hidden_layers)
    for key, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == count:
            setattr(config, key, type(value)(value[:keep]))
    config.num_hidden_layers = keep
    with torch.device("cpu"):
        hf_model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return HFCausalLM(hf_model.float())
