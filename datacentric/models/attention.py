"""Variable-length attention and the attention-callable contract of our models.

Shape legend: S = tokens of a packed sequence (several samples concatenated),
H = heads, D = head dim. Packed tensors have no batch dimension, as in
``flash_attn_varlen_func``: ``q_SHD`` is ``(total_tokens, heads, head_dim)``.

Models never import the distributed package. They call an *attention callable*
with the signature of :data:`AttentionFn`; the default is :func:`varlen_attention`
(single process). The sequence-parallel runtime injects a callable with the same
signature that receives the local shard of the sequence, while ``cu_seqlens``
always describes the *full* (global, padded) packed sequence.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

try:  # pragma: no cover - only on CUDA machines with flash-attn installed
    from flash_attn import flash_attn_varlen_func as _flash_varlen
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_varlen = None


class AttentionFn(Protocol):
    """``(q_SHD, k_SHD, v_SHD, cu_seqlens, causal) -> out_SHD``.

    ``cu_seqlens`` is an int tensor of segment boundaries over the full packed
    sequence (``[0, len_0, len_0 + len_1, ..., S_full]``); tokens attend only
    within their own segment.
    """

    def __call__(
        self,
        q_SHD: torch.Tensor,
        k_SHD: torch.Tensor,
        v_SHD: torch.Tensor,
        cu_seqlens: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor: ...


def varlen_attention(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
) -> torch.Tensor:
    """Attention within each segment of a packed sequence.

    Uses ``flash_attn_varlen_func`` on CUDA when installed (fp16/bf16), otherwise
    one ``scaled_dot_product_attention`` call per segment. Both are exact.
    """
    if q_SHD.shape[0] != int(cu_seqlens[-1]):
        raise ValueError(
            f"packed sequence has {q_SHD.shape[0]} tokens but cu_seqlens ends at "
            f"{int(cu_seqlens[-1])}"
        )
    if (
        _flash_varlen is not None
        and q_SHD.is_cuda
        and q_SHD.dtype in (torch.float16, torch.bfloat16)
    ):  # pragma: no cover - CUDA only
        cu = cu_seqlens.to(device=q_SHD.device, dtype=torch.int32)
        max_len = int((cu[1:] - cu[:-1]).max())
        return _flash_varlen(q_SHD, k_SHD, v_SHD, cu, cu, max_len, max_len, causal=causal)
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        # (S, H, D) -> (1, H, S, D) for SDPA, then back.
        q = q_SHD[start:end].transpose(0, 1).unsqueeze(0)
        k = k_SHD[start:end].transpose(0, 1).unsqueeze(0)
        v = v_SHD[start:end].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)
