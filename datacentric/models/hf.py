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
interface). Sliding windows (Mistral, Qwen2, Gemma, Phi-3) are run exactly: the layer's
``sliding_window`` reaches the attention callable as its ``window``.

Dropout outside attention (GPT-2's ``resid_pdrop``/``embd_pdrop``, ...) runs as the
model defines it while the module is in training mode: masks come from the torch
random stream of the rank that runs the token (recomputation replays the same masks).
``model.eval()`` turns it off; ``datacentric equivalence`` runs that way.

Shape legend: B = batch rows (always 1 here), H = query heads, Hkv = key/value
heads, S = tokens of the (possibly sharded) packed batch, D = head dim, V = vocab.

This module does not import the distributed package.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.batch import IGNORE_INDEX, PackedBatch
from datacentric.models.attention import AttentionFn, AttentionSlot, varlen_attention

try:
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.hf needs transformers: pip install 'datacentric[hf]'"
    ) from _error


class UnsupportedModelFeature(ValueError):
    """A model feature the packed, sequence-parallel path cannot run exactly."""


ATTENTION_NAME = "datacentric"
"""The name :func:`packed_attention_forward` is registered under in transformers."""

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
"""Defaults of :func:`build_hf_llama`: a small byte-level Llama (vocabulary 256)."""


def packed_attention_forward(
    module: nn.Module,
    query_BHSD: torch.Tensor,
    key_BHSD: torch.Tensor,
    value_BHSD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    cu_seqlens: torch.Tensor | None = None,
    datacentric_attention: AttentionFn | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function that calls an :data:`AttentionFn`.

    transformers passes ``(B, H, S, D)`` queries and ``(B, Hkv, S, D)`` keys and
    values (RoPE applied), returns ``(B, S, H, D)``. Here ``B`` must be 1 (one
    packed row), ``cu_seqlens`` describes the full packed sequence and
    ``datacentric_attention`` is the callable (both forwarded by
    :meth:`HFCausalLM.forward`). Grouped key/value heads are passed as they are
    (the callable and Ulysses handle ``Hkv < H``); the layer's ``sliding_window``
    becomes the callable's ``window``. A feature that would change the result and
    that no path runs (``softcap``, attention sinks) raises, never passes silently.
    """
    for name in REFUSED_KWARGS:
        if kwargs.get(name) is not None:
            raise UnsupportedModelFeature(
                f"{type(module).__name__} passes {name}={kwargs[name]!r} to attention, which "
                "packed sequence-parallel attention cannot apply exactly"
            )
    if cu_seqlens is None:
        raise ValueError(
            f"the {ATTENTION_NAME!r} attention implementation needs cu_seqlens (the packed "
            "layout); call HFCausalLM.forward(batch), or switch the model back with "
            "model.hf.set_attn_implementation('sdpa') for plain Hugging Face use"
        )
    if attention_mask is not None:
        raise ValueError(
            "packed sequences take no attention mask: sample boundaries come from cu_seqlens"
        )
    if dropout:
        raise ValueError(f"attention dropout {dropout} is not supported (set it to 0)")
    if query_BHSD.shape[0] != 1:
        raise ValueError(f"a packed batch has one row, got {query_BHSD.shape[0]}")
    attention = datacentric_attention if datacentric_attention is not None else varlen_attention
    head_dim = query_BHSD.shape[-1]
    q_SHD = query_BHSD[0].transpose(0, 1)
    if scaling is not None and not math.isclose(scaling, head_dim**-0.5, rel_tol=1e-12):
        # Our kernels scale by 1/sqrt(D); fold a different softmax scale into q.
        q_SHD = q_SHD * (scaling * math.sqrt(head_dim))
    k_SHD = key_BHSD[0].transpose(0, 1)
    v_SHD = value_BHSD[0].transpose(0, 1)
    causal = getattr(module, "is_causal", True)
    # Only a windowed layer passes ``window``: a callable without the keyword then
    # fails loudly instead of attending over the whole sample.
    extra = {} if sliding_window is None else {"window": int(sliding_window)}
    out_SHD = attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, **extra)
    return out_SHD.unsqueeze(0), None


#: attention keyword arguments of transformers layers that change the result and that
#: no path here runs; a layer passing one of them non-None is refused
REFUSED_KWARGS = ("softcap", "s_aux", "sinks")


def register_attention() -> None:
    """Register :func:`packed_attention_forward` as transformers' ``"datacentric"``."""
    AttentionInterface.register(ATTENTION_NAME, packed_attention_forward)


class HFCausalLM(AttentionSlot, nn.Module):
    """A transformers decoder-only causal LM with our model contract.

    ``hf_model`` is an unmodified decoder-only ``*ForCausalLM`` (Llama, Mistral,
    Qwen2/3, Gemma2/3, Phi-3, GPT-2, GPT-NeoX, ...). Its parameters are this
    module's, under the prefix ``hf.``. ``attention`` is the
    :data:`AttentionFn` to start with (single-process varlen attention).
    """

    loss_mode = "token"

    def __init__(self, hf_model: nn.Module, attention: AttentionFn = varlen_attention) -> None:
        super().__init__()
        check_supported(hf_model.config, type(hf_model).__name__, type(hf_model))
        self.hf = hf_model
        self.config = hf_model.config
        self.num_heads = int(self.config.num_attention_heads)
        self.num_kv_heads = int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)
        self.blocks = decoder_layers(hf_model)
        register_attention()
        self.hf.set_attn_implementation(ATTENTION_NAME)
        self.set_attention(attention)

    def logits(self, batch: PackedBatch) -> torch.Tensor:
        """Next-token logits ``(S, V)`` of a packed batch or shard (model dtype)."""
        if batch.inputs.dim() != 1:
            raise ValueError(
                f"a causal LM expects token ids of shape (S,), got {tuple(batch.inputs.shape)}"
            )
        out = self.hf(
            input_ids=batch.inputs.long().unsqueeze(0),
            position_ids=batch.position_ids.long().unsqueeze(0),
            use_cache=False,
            cu_seqlens=batch.cu_seqlens,
            datacentric_attention=self.attention,
        )
        return out.logits[0]

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Unreduced next-token cross-entropy ``(S,)`` (float32), 0 where ``loss_mask`` is False."""
        logits_SV = self.logits(batch).float()
        loss_S = F.cross_entropy(
            logits_SV, batch.targets.long(), ignore_index=IGNORE_INDEX, reduction="none"
        )
        return torch.where(batch.loss_mask, loss_S, torch.zeros_like(loss_S))


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
    interface. Cheap: reads the config only (call it before building the weights)."""

    def refuse(feature: str, fix: str) -> None:
        raise UnsupportedModelFeature(
            f"{what}: {feature} cannot run exactly with packed sequence-parallel attention; {fix}"
        )

    model_type = str(getattr(config, "model_type", ""))
    if getattr(config, "is_encoder_decoder", False):
        refuse("encoder-decoder attention (is_encoder_decoder=True)", "use a decoder-only LM")
    if getattr(config, "add_cross_attention", False):
        refuse("cross-attention (add_cross_attention=True)", "use a decoder-only causal LM")
    attn_config = getattr(config, "attn_config", None)  # MPT keeps ALiBi here
    if (
        model_type == "bloom"
        or getattr(config, "alibi", False)
        or getattr(attn_config, "alibi", False)
    ):
        refuse(
            f"ALiBi position biases ({model_type or 'alibi=True'}: a bias added to the "
            "attention scores, which our attention kernels do not compute)",
            "use a model with rotary or learned positions",
        )
    if getattr(config, "attn_logit_softcapping", None) is not None:
        refuse(
            f"attention-logit softcapping (attn_logit_softcapping="
            f"{config.attn_logit_softcapping!r}, a tanh on the scores inside attention)",
            "set attn_logit_softcapping=None",
        )
    if "local" in (getattr(config, "attention_layers", None) or ()):
        refuse(
            f"GPT-Neo local attention (attention_types with 'local' layers, window_size="
            f"{getattr(config, 'window_size', None)!r}, computed in the model's own code)",
            "use a model that routes attention through transformers' attention interface",
        )
    if getattr(config, "attention_chunk_size", None) is not None:
        refuse(
            f"chunked attention (attention_chunk_size={config.attention_chunk_size!r}: "
            "tokens attend only within fixed chunks of the row)",
            "set attention_chunk_size=None",
        )
    if getattr(config, "attn_temperature_tuning", False):
        refuse(
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
            refuse(
                f"rope_type={rope_type!r} ({reason})",
                f"use one of {', '.join(POSITION_LOCAL_ROPE_TYPES)}",
            )
    for name in ATTENTION_DROPOUT_SETTINGS:
        if float(getattr(config, name, 0.0) or 0.0) > 0.0:
            refuse(
                f"dropout on attention probabilities ({name}={getattr(config, name)!r}; our "
                "attention kernels apply none)",
                f"set {name}=0 (dropout outside attention runs: docs/huggingface.md)",
            )
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        refuse(
            f"num_key_value_heads={kv_heads} (not a divisor of the {heads} attention heads)",
            f"use a divisor of {heads}",
        )
    compatible = getattr(model_class, "is_backend_compatible", None)
    if model_class is not None and (compatible is None or not compatible()):
        refuse(
            "attention computed in the model's own code, not through transformers' "
            f"attention interface ({model_class.__name__} does not support attention "
            "backends, so no attention callable can replace it)",
            "use an architecture that supports attention backends (Llama, Mistral, Qwen2/3, "
            "Gemma2/3, Phi-3, GPT-2, GPT-NeoX, OLMo, Starcoder2, ...)",
        )


def decoder_layers(hf_model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a ``*ForCausalLM``, wherever the architecture keeps them:
    the shallowest ``nn.ModuleList`` whose length is the config's layer count
    (``model.layers``, ``transformer.h``, ``gpt_neox.layers``, ...), which must be unique."""
    count = int(hf_model.config.num_hidden_layers)
    lists = [
        (name.count("."), name, m)
        for name, m in hf_model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) == count
    ]
    shallowest = [entry for entry in lists if entry[0] == min((e[0] for e in lists), default=0)]
    if len(shallowest) != 1:
        raise UnsupportedModelFeature(
            f"{type(hf_model).__name__}: found {len(shallowest)} module lists of {count} "
            f"layers at the shallowest depth ({[e[1] for e in shallowest]}), expected exactly "
            "one (the decoder layers)"
        )
    return shallowest[0][2]


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
}


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
    model = HFCausalLM(AutoModelForCausalLM.from_config(config), attention=attention)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


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
