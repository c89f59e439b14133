"""Layers shared by the reference models: RMSNorm, rotary embeddings, SwiGLU, attention.

Shape legend: S = tokens of a packed sequence (or of its shard), D = model width,
H = heads, Dh = head dim, P = rotary pairs per head (``Dh // 2``), N = samples.

Everything here is per token (a row depends only on that row and on ``cu_seqlens``),
so a contiguous shard of a packed sequence gives the rows of the full sequence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from datacentric.models.attention import AttentionFn
from datacentric.models.configs import rope_3d_pairs


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 and cast back."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_inverse_frequencies(
    pairs: int, theta: float, device: torch.device | None = None
) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-i / pairs)`` for ``i < pairs`` (float32), made on
    ``device`` (no host-to-device copy inside a forward)."""
    return theta ** (-torch.arange(pairs, dtype=torch.float32, device=device) / pairs)


def rope_angles(position_ids: torch.Tensor, pairs: int, theta: float) -> torch.Tensor:
    """Rotary angles ``(S, pairs)`` of 1D positions ``(S,)`` in float32."""
    inv = rope_inverse_frequencies(pairs, theta, position_ids.device)
    return position_ids.float()[:, None] * inv[None, :]


def rope_angles_3d(position_ids_S3: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Rotary angles ``(S, head_dim // 2)`` of (frame, row, column) positions ``(S, 3)``:
    each axis rotates its own slice of the head's pairs."""
    parts = [
        rope_angles(position_ids_S3[:, axis], pairs, theta)
        for axis, pairs in enumerate(rope_3d_pairs(head_dim))
    ]
    return torch.cat(parts, dim=-1)


def apply_rotary(x_SHD: torch.Tensor, angles_SP: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[i], x[i + Dh/2])`` of every head by ``angles`` (computed in float32)."""
    half = x_SHD.shape[-1] // 2
    cos = torch.cos(angles_SP)[:, None, :]
    sin = torch.sin(angles_SP)[:, None, :]
    x1 = x_SHD[..., :half].float()
    x2 = x_SHD[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x_SHD.dtype)


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``, the Llama feed-forward."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class PackedSelfAttention(nn.Module):
    """Multi-head self-attention over a packed sequence through an injected callable.

    q/k/v are ``(S, H, Dh)``; rotary angles ``(S, Dh // 2)`` come from global
    position ids; ``cu_seqlens`` describes the full packed sequence.
    """

    def __init__(
        self, dim: int, num_heads: int, *, causal: bool, bias: bool, attention: AttentionFn
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"model width {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.causal = causal
        self.set_attention(attention)
        self.wq = nn.Linear(dim, dim, bias=bias)
        self.wk = nn.Linear(dim, dim, bias=bias)
        self.wv = nn.Linear(dim, dim, bias=bias)
        self.wo = nn.Linear(dim, dim, bias=bias)

    def set_attention(self, attention: AttentionFn) -> None:
        """Use ``attention`` from now on.

        Stored as a plain attribute, not a submodule, so that an ``nn.Module``
        callable (holding a process group, say) is neither registered, moved,
        nor saved, and can later be swapped for a plain function.
        """
        object.__setattr__(self, "attention", attention)

    def forward(
        self, x_SD: torch.Tensor, angles_SP: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        S = x_SD.shape[0]
        q_SHD = self.wq(x_SD).view(S, self.num_heads, self.head_dim)
        k_SHD = self.wk(x_SD).view(S, self.num_heads, self.head_dim)
        v_SHD = self.wv(x_SD).view(S, self.num_heads, self.head_dim)
        q_SHD = apply_rotary(q_SHD, angles_SP)
        k_SHD = apply_rotary(k_SHD, angles_SP)
        out_SHD = self.attention(q_SHD, k_SHD, v_SHD, cu_seqlens, self.causal)
        return self.wo(out_SHD.reshape(S, -1))


def set_attention_everywhere(module: nn.Module, attention: AttentionFn) -> int:
    """Point every :class:`PackedSelfAttention` inside ``module`` at ``attention``.

    Returns how many layers were changed (a model with none is an error).
    """
    count = 0
    for sub in module.modules():
        if isinstance(sub, PackedSelfAttention):
            sub.set_attention(attention)
            count += 1
    if count == 0:
        raise ValueError(f"{type(module).__name__} has no attention layer to set")
    return count


def timestep_embedding(t_N: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding ``(N, dim)`` of diffusion times ``t`` in [0, 1) (scaled by 1000)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t_N.device) / half
    )
    args = (t_N.float() * 1000.0)[:, None] * freqs[None, :]
    emb = torch.cat((torch.cos(args), torch.sin(args)), dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


def count_parameters(module: nn.Module) -> int:
    """Number of parameters (works on the meta device)."""
    return sum(p.numel() for p in module.parameters())
