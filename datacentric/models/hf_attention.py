"""How a transformers model's attention reaches our attention callable.

:func:`packed_attention_forward` is registered once as transformers' ``"datacentric"``
attention implementation (``AttentionInterface.register``, :func:`register_attention`);
a model switched to it (``config._attn_implementation``) hands every attention layer's
queries, keys and values to it, and the callable and the packed layout (``cu_seqlens``)
travel to it as keyword arguments of the model's forward
(:class:`~datacentric.models.hf.HFCausalLM`). What changes the result and no path runs
exactly (softcapping, attention sinks, a mask of the layer's own, a layer that drops the
forward's keyword arguments) is refused with :class:`UnsupportedModelFeature`.

Shape legend: B = batch rows (always 1 here), H = query heads, Hkv = key/value heads,
S = tokens of the (possibly sharded) packed batch, D = head dim.

This module does not import the distributed package.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.models.attention import AttentionFn, varlen_attention

try:
    from transformers import AttentionInterface
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.hf needs transformers: pip install 'datacentric[hf]'"
    ) from _error


class UnsupportedModelFeature(ValueError):
    """A model feature the packed, sequence-parallel path cannot run exactly."""


ATTENTION_NAME = "datacentric"
"""The name :func:`packed_attention_forward` is registered under in transformers."""


#: set while :meth:`HFCausalLM.logits` runs the model with the packed layout, so that
#: attention called without it is known to have lost the keyword arguments on the way
_PACKED_CALL: ContextVar[bool] = ContextVar("datacentric_packed_call", default=False)


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
    for name, meaning in REFUSED_KWARGS.items():
        value = kwargs.get(name)
        if value is not None:
            shown = f"a {tuple(value.shape)} tensor" if torch.is_tensor(value) else repr(value)
            raise UnsupportedModelFeature(
                f"{type(module).__name__} passes {name}={shown} ({meaning}) to attention, "
                "which packed sequence-parallel attention cannot apply exactly"
            )
    if cu_seqlens is None:
        if _PACKED_CALL.get():  # HFCausalLM.forward passed it: a layer dropped it
            raise UnsupportedModelFeature(
                f"{type(module).__name__} is called without the keyword arguments of the "
                "model's forward (its decoder layers do not pass them through, although the "
                "model declares attention backends), so the packed layout (cu_seqlens) cannot "
                "reach attention"
            )
        raise ValueError(
            f"the {ATTENTION_NAME!r} attention implementation needs cu_seqlens (the packed "
            "layout); call HFCausalLM.forward(batch), or switch the model back with "
            "model.hf.set_attn_implementation('sdpa') for plain Hugging Face use"
        )
    if attention_mask is not None:
        # "datacentric" builds no mask: a mask here is the layer's own (a score bias)
        raise UnsupportedModelFeature(
            f"{type(module).__name__} passes an attention mask of its own (a bias on the "
            "attention scores, computed in the model's code), which packed attention cannot "
            "apply exactly: sample boundaries come from cu_seqlens"
        )
    if dropout:
        raise ValueError(f"attention dropout {dropout} is not supported (set it to 0)")
    if query_BHSD.shape[0] != 1:
        raise ValueError(f"a packed batch has one row, got {query_BHSD.shape[0]}")
    attention = datacentric_attention if datacentric_attention is not None else varlen_attention
    q_SHD, k_SHD, v_SHD = (t[0].transpose(0, 1) for t in (query_BHSD, key_BHSD, value_BHSD))
    qk_dim, v_dim = q_SHD.shape[-1], v_SHD.shape[-1]
    head_dim = max(qk_dim, v_dim)
    if v_dim != qk_dim:
        # Multi-head latent attention (DeepSeek-V3): value heads wider or narrower than
        # query/key heads. Zeros pad both to one head dim (scores and outputs unchanged;
        # the extra output columns are zero and cut off), so every path sees one width.
        q_SHD, k_SHD = (F.pad(t, (0, head_dim - qk_dim)) for t in (q_SHD, k_SHD))
        v_SHD = F.pad(v_SHD, (0, head_dim - v_dim))
    scale = qk_dim**-0.5 if scaling is None else scaling
    if not math.isclose(scale, head_dim**-0.5, rel_tol=1e-12):
        # Our kernels scale by 1/sqrt(D); fold a different softmax scale into q.
        q_SHD = q_SHD * (scale * math.sqrt(head_dim))
    causal = getattr(module, "is_causal", True)
    # Only a windowed layer passes ``window``: a callable without the keyword then
    # fails loudly instead of attending over the whole sample.
    extra = {} if sliding_window is None else {"window": int(sliding_window)}
    out_SHD = attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, **extra)
    return out_SHD[..., :v_dim].unsqueeze(0), None


#: attention keyword arguments of transformers layers that change the result and that
#: no path here runs (with what they mean); a layer passing one of them non-None is refused
REFUSED_KWARGS = {
    "softcap": "attention-logit softcapping",
    "s_aux": "attention sinks, GPT-OSS",
    "sinks": "attention sinks",
}


def register_attention() -> None:
    """Register :func:`packed_attention_forward` as transformers' ``"datacentric"``."""
    AttentionInterface.register(ATTENTION_NAME, packed_attention_forward)
