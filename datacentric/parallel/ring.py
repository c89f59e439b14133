"""Ring attention over packed variable-length sequences, and its hybrid with Ulysses.

Shape legend: S = tokens of the full packed (padded) sequence, r = ring positions,
u = Ulysses ranks per position, n = tokens a ring position holds (``S / r``),
H = query heads and Hkv = key/value heads a position attends with, D = head dim.

**Ring.** Position ``i`` of a ring holds the tokens :func:`~datacentric.parallel.
ring_layout.ring_layout` gives it (zigzag per segment, so causal work is balanced).
In ``r`` steps it attends its queries to the keys and values of position ``i``, then
``i - 1``, ``i - 2``, ...: each step passes the ``(2, n, Hkv, D)`` key/value block on
to the next position (point-to-point, started before the step's compute so the two
overlap on a GPU) and merges the block's partial output into the running one by
log-sum-exp: ``lse = logaddexp(lse_a, lse_b)``, ``out = e^(lse_a - lse) out_a +
e^(lse_b - lse) out_b``. Keys and values travel at their own head count.

**Backward** is written out (flash-attention's recurrence): with the final output and
log-sum-exp saved, each block's probabilities are ``exp(s - lse)``; the key/value
blocks go round the ring again and each carries its gradient accumulator with it, so
after ``r`` steps and one last pass every position holds the gradient of its own keys
and values. Gradients accumulate in float32.

**Kernels** (:data:`RING_KERNELS`), per block: ``math`` is the definition (an explicit
mask from each token's segment and global position; float32; exact, any device,
sliding windows included); ``flash`` is PyTorch's flash-attention varlen kernel
(``aten._flash_attention_forward/backward``, which return and take the log-sum-exp),
CUDA fp16/bf16 only, one call per block over the block's (query range, key range)
pairs (:meth:`~datacentric.parallel.ring_layout.RingLayout.block_pairs`). The
``flash`` path was written for GPUs and has not been run in this repository's tests
(no GPU); windows always take ``math``.

**Hybrid.** ``ulysses.ulysses_attention(..., ring=...)`` runs Ulysses inside each ring
position: the position's ``u`` ranks hold contiguous pieces of its ``n`` tokens, an
all-to-all gives each of them all ``n`` tokens and ``1/u`` of the heads, this ring runs
on those heads, and the reverse all-to-all restores the token split.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.distributed as dist

from datacentric.batch import segment_offsets
from datacentric.parallel.annotate import annotate, recording
from datacentric.parallel.groups import RingGroup
from datacentric.parallel.ring_layout import RingLayout, ring_layout

#: block kernels of ring attention (see the module doc)
RING_KERNELS = ("flash", "math")
#: environment variable that forces one kernel
RING_KERNEL_ENV = "DATACENTRIC_RING_KERNEL"


def ring_kernel(q_SHD: torch.Tensor, window: int | None, forced: str | None = None) -> str:
    """The block kernel for ``q_SHD``: ``flash`` on CUDA in fp16/bf16 without a window
    where torch has the op, else ``math``; ``forced`` (or ``DATACENTRIC_RING_KERNEL``)
    picks one, an impossible choice being an error."""
    can_flash = (
        q_SHD.is_cuda
        and q_SHD.dtype in (torch.float16, torch.bfloat16)
        and window is None
        and hasattr(torch.ops.aten, "_flash_attention_forward")
    )
    forced = (forced or os.environ.get(RING_KERNEL_ENV, "")).strip().lower()
    if not forced:
        return "flash" if can_flash else "math"
    if forced not in RING_KERNELS:
        raise ValueError(f"ring kernel {forced!r}: choose one of {', '.join(RING_KERNELS)}")
    if forced == "flash" and not can_flash:
        raise ValueError(
            f"ring kernel 'flash' cannot run {q_SHD.dtype} on {q_SHD.device.type}"
            + (" with a window" if window is not None else "")
            + "; use 'math'"
        )
    return forced


# --- the math kernel: the definition, per block -------------------------------------


def _block_mask(
    layout: RingLayout, qi: int, kj: int, causal: bool, window: int | None, device
) -> torch.Tensor:
    """``(n_q, n_k)``: which keys of position ``kj`` each query of ``qi`` may see, from
    each token's segment and global position (independent of ``block_pairs``)."""
    pos_q, pos_k = layout.tokens(qi).to(device), layout.tokens(kj).to(device)
    seg_q, seg_k = layout.segment_ids(qi).to(device), layout.segment_ids(kj).to(device)
    keep = seg_q[:, None] == seg_k[None, :]
    delta = pos_q[:, None] - pos_k[None, :]
    if causal:
        keep &= delta >= 0
    if window is not None:
        keep &= delta < window
    return keep


def _repeat_kv(t_SHD: torch.Tensor, heads: int) -> torch.Tensor:
    groups = heads // t_SHD.shape[1]
    return t_SHD if groups == 1 else t_SHD.repeat_interleave(groups, dim=1)


def _sum_kv(t_SHD: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Gradient of :func:`_repeat_kv`: sum each key/value head's query-head group."""
    groups = t_SHD.shape[1] // kv_heads
    return t_SHD if groups == 1 else t_SHD.unflatten(1, (kv_heads, groups)).sum(2)


def _math_forward(q, k, v, keep_QK, scale):
    """Partial attention of one block: ``out (n_q, H, D)`` and ``lse (H, n_q)``, float32;
    a query that sees no key gets ``out = 0`` and ``lse = -inf``."""
    k, v = (_repeat_kv(t, q.shape[1]).float() for t in (k, v))
    s_HQK = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    s_HQK = s_HQK.masked_fill(~keep_QK, float("-inf"))
    lse_HQ = torch.logsumexp(s_HQK, dim=-1)
    p_HQK = torch.exp(s_HQK - _finite(lse_HQ)[..., None])
    return torch.einsum("hqk,khd->qhd", p_HQK, v), lse_HQ


def _math_backward(dout, q, k, v, out, lse, keep_QK, scale):
    """Gradients of one block from the *final* output and log-sum-exp (float32)."""
    kv_heads = k.shape[1]
    k, v = (_repeat_kv(t, q.shape[1]).float() for t in (k, v))
    qf, dout = q.float(), dout.float()
    s_HQK = torch.einsum("qhd,khd->hqk", qf, k) * scale
    p_HQK = torch.exp(s_HQK - _finite(lse)[..., None]).masked_fill(~keep_QK, 0.0)
    dv = torch.einsum("hqk,qhd->khd", p_HQK, dout)
    dp_HQK = torch.einsum("qhd,khd->hqk", dout, v)
    delta_HQ = (dout * out).sum(-1).transpose(0, 1)
    ds_HQK = p_HQK * (dp_HQK - delta_HQ[..., None])
    dq = torch.einsum("hqk,khd->qhd", ds_HQK, k) * scale
    dk = torch.einsum("hqk,qhd->khd", ds_HQK, qf) * scale
    return dq, _sum_kv(dk, kv_heads), _sum_kv(dv, kv_heads)


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with ``-inf`` (a query that saw no key) as 0, so ``exp(s - lse)`` is 0."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


# --- the flash kernel: PyTorch's varlen flash attention, per block -------------------


def _pair_rows(pairs, side: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Local rows of every pair's range on ``side`` (0 queries, 1 keys), their
    ``cu_seqlens`` (int32) and the longest range."""
    ranges = [p.q if side == 0 else p.k for p in pairs]
    rows = torch.cat([torch.arange(a, b) for a, b in ranges]).to(device)
    lengths = [b - a for a, b in ranges]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return rows, cu.to(device), max(lengths)


def _flash_forward(q, k, v, pairs, scale):  # pragma: no cover - CUDA only
    q_rows, cu_q, max_q = _pair_rows(pairs, 0, q.device)
    k_rows, cu_k, max_k = _pair_rows(pairs, 1, q.device)
    kk, vv = (_repeat_kv(t[k_rows], q.shape[1]) for t in (k, v))
    out_part, lse_part, *_ = torch.ops.aten._flash_attention_forward(
        q[q_rows], kk, vv, cu_q, cu_k, max_q, max_k, 0.0, pairs[0].causal, False, scale=scale
    )
    out = q.new_zeros(q.shape, dtype=torch.float32)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    out[q_rows] = out_part.float()
    lse[:, q_rows] = lse_part.float()
    return out, lse


def _flash_backward(dout, q, k, v, out, lse, pairs, scale):  # pragma: no cover - CUDA only
    q_rows, cu_q, max_q = _pair_rows(pairs, 0, q.device)
    k_rows, cu_k, max_k = _pair_rows(pairs, 1, q.device)
    kk, vv = (_repeat_kv(t[k_rows], q.shape[1]) for t in (k, v))
    unused = torch.empty(0, device=q.device)
    dq_p, dk_p, dv_p = torch.ops.aten._flash_attention_backward(
        dout[q_rows].to(q.dtype),
        q[q_rows],
        kk,
        vv,
        out[q_rows].to(q.dtype),
        lse[:, q_rows].contiguous(),
        cu_q,
        cu_k,
        max_q,
        max_k,
        0.0,
        pairs[0].causal,
        unused,
        unused,
        scale=scale,
    )
    dq = q.new_zeros(q.shape, dtype=torch.float32)
    dk = k.new_zeros(k.shape, dtype=torch.float32)
    dv = v.new_zeros(v.shape, dtype=torch.float32)
    dq[q_rows] = dq_p.float()
    dk[k_rows] = _sum_kv(dk_p.float(), k.shape[1])
    dv[k_rows] = _sum_kv(dv_p.float(), k.shape[1])
    return dq, dk, dv


# --- the ring ------------------------------------------------------------------------


def _start_shift(tensors: list[torch.Tensor], ring: RingGroup):
    """Send each tensor to the next position and receive as many from the previous one
    (asynchronous); returns the requests and the receive buffers."""
    received = [torch.empty_like(t) for t in tensors]
    ops = []
    for tag, (send, recv) in enumerate(zip(tensors, received)):
        ops.append(dist.P2POp(dist.isend, send.contiguous(), ring.next_rank, tag=tag))
        ops.append(dist.P2POp(dist.irecv, recv, ring.prev_rank, tag=tag))
    return dist.batch_isend_irecv(ops), received


def _finish_shift(started) -> list[torch.Tensor]:
    requests, received = started
    for request in requests:
        request.wait()
    return received


def merge_partial(out_a, lse_a, out_b, lse_b):
    """Two partial attention results over disjoint keys as one (see the module doc);
    ``out (n, H, D)``, ``lse (H, n)``; a query that has seen no key stays at 0 / -inf."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = _finite(lse)
    w_a = torch.exp(lse_a - safe).transpose(0, 1)[..., None]
    w_b = torch.exp(lse_b - safe).transpose(0, 1)[..., None]
    return w_a * out_a + w_b * out_b, lse


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, layout, ring, causal, window, kernel):
        scale = 1.0 / math.sqrt(q.shape[-1])
        me, r = ring.index, ring.size
        kv = torch.stack([k, v])
        out = lse = None
        for step in range(r):
            source = (me - step) % r
            with annotate(f"ring step {step + 1}/{r} forward" if recording() else ""):
                started = _start_shift([kv], ring) if step < r - 1 else None
                if kernel == "flash":
                    pairs = layout.block_pairs(me, source, causal)
                    part = _flash_forward(q, kv[0], kv[1], pairs, scale) if pairs else None
                else:
                    keep = _block_mask(layout, me, source, causal, window, q.device)
                    part = _math_forward(q, kv[0], kv[1], keep, scale)
                if part is not None:
                    out, lse = part if out is None else merge_partial(out, lse, *part)
                if started is not None:
                    (kv,) = _finish_shift(started)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.ring, ctx.causal, ctx.window, ctx.kernel = (
            layout,
            ring,
            causal,
            window,
            kernel,
        )
        ctx.scale = scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout):
        q, k, v, out, lse = ctx.saved_tensors
        r = ctx.ring.size
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(r):
            with annotate(f"ring step {step + 1}/{r} backward" if recording() else ""):
                dq, dkv, kv = _backward_step(ctx, dout, (q, kv, out, lse), dq, dkv, step)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), *([None] * 5)


def _backward_step(ctx: Any, dout, saved, dq, dkv, step: int):
    """One step of the ring's backward: this position's gradients of the block it
    holds, then the block and its accumulator move on (returns ``dq, dkv, kv``)."""
    q, kv, out, lse = saved
    layout, ring, causal = ctx.layout, ctx.ring, ctx.causal
    me, r = ring.index, ring.size
    source = (me - step) % r
    if ctx.kernel == "flash":
        pairs = layout.block_pairs(me, source, causal)
        grads = (
            _flash_backward(dout, q, kv[0], kv[1], out, lse, pairs, ctx.scale) if pairs else None
        )
    else:
        keep = _block_mask(layout, me, source, causal, ctx.window, q.device)
        grads = _math_backward(dout, q, kv[0], kv[1], out, lse, keep, ctx.scale)
    if grads is not None:
        dq += grads[0]
        dkv += torch.stack([grads[1], grads[2]])
    # the block and its accumulator move on together; after the last step only
    # the accumulator moves, which brings it home to its owner
    if r > 1:
        sent = [dkv] if step == r - 1 else [dkv, kv]
        received = _finish_shift(_start_shift(sent, ring))
        dkv = received[0]
        if step < r - 1:
            kv = received[1]
    return dq, dkv, kv


@torch.compiler.disable  # host-side layout and point-to-point sends: runs eagerly
def ring_attention(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    ring: RingGroup,
    *,
    window: int | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """Attention of this ring position's tokens (``ring_layout(...).tokens(ring.index)``,
    in that order) over the whole packed sequence ``cu_seqlens`` describes.

    ``q_SHD`` is ``(n, H, D)``, ``k/v_SHD`` ``(n, Hkv, D)`` with ``Hkv`` dividing ``H``;
    returns ``(n, H, D)``. ``window`` (causal only) as in ``AttentionFn``. ``kernel``:
    one of :data:`RING_KERNELS` (default :func:`ring_kernel`). Collective over the ring.
    Left out of compiled graphs (a compiled block runs it eagerly).
    """
    if window is not None and (not causal or int(window) < 1):
        raise ValueError(f"a sliding window needs causal attention and window >= 1, got {window}")
    if q_SHD.shape[1] % k_SHD.shape[1]:
        raise ValueError(
            f"{q_SHD.shape[1]} query heads are not a multiple of {k_SHD.shape[1]} key/value heads"
        )
    layout = ring_layout(segment_offsets(cu_seqlens), ring.size)
    expected = layout.num_local(ring.index)
    if q_SHD.shape[0] != expected:
        raise ValueError(
            f"ring position {ring.index} of {ring.size} holds {expected} tokens of the packed "
            f"sequence, got {q_SHD.shape[0]} (shard with sharding.shard_batch(..., ring=...))"
        )
    chosen = ring_kernel(q_SHD, window, kernel)
    return _RingAttention.apply(q_SHD, k_SHD, v_SHD, layout, ring, causal, window, chosen)
