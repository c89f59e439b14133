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

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from datacentric.batch import host_to_device, segment_bounds, segment_offsets

try:  # pragma: no cover - only on CUDA machines with flash-attn installed
    from flash_attn import flash_attn_varlen_func as _flash_varlen
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_varlen = None

try:  # torch >= 2.10: a varlen flash kernel in PyTorch itself (CUDA only)
    from torch.nn.attention.varlen import varlen_attn as _torch_varlen
except Exception:  # noqa: BLE001 - older torch
    _torch_varlen = None

try:  # torch >= 2.6 (BlockMask.from_kv_blocks with seq_lengths)
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except Exception:  # noqa: BLE001 - older torch
    BlockMask = flex_attention = None

#: attention paths :func:`varlen_attention` can take, in the order it prefers them on CUDA
PATHS = ("varlen", "flash", "flex", "sdpa")
#: environment variable that forces one path (for benchmarks and checks)
PATH_ENV = "DATACENTRIC_ATTENTION"


class AttentionFn(Protocol):
    """``(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None) -> out_SHD``.

    ``cu_seqlens`` is an int tensor of segment boundaries over the full packed
    sequence (``[0, len_0, len_0 + len_1, ..., S_full]``); tokens attend only
    within their own segment. ``k_SHD``/``v_SHD`` may have fewer heads than
    ``q_SHD`` (grouped-query attention: query head ``h`` reads key/value head
    ``h // (H / Hkv)``). ``window`` (causal only) lets query ``i`` see keys
    ``j`` with ``i - window < j <= i``, transformers' ``sliding_window``.
    """

    def __call__(
        self,
        q_SHD: torch.Tensor,
        k_SHD: torch.Tensor,
        v_SHD: torch.Tensor,
        cu_seqlens: torch.Tensor,
        causal: bool,
        *,
        window: int | None = None,
    ) -> torch.Tensor: ...


class AttentionSlot:
    """Mixin for a model adapter whose attention layers all call one :data:`AttentionFn`
    held by the adapter: :meth:`set_attention` swaps it, :attr:`attention` reads it.

    The callable is a plain attribute, never a submodule: an ``nn.Module`` callable
    (holding a process group, say) is neither registered, moved nor saved, and its
    parameters, if any, are not the model's.
    """

    def set_attention(self, attention: AttentionFn) -> None:
        """Use ``attention`` in every attention layer from now on."""
        self.__dict__["_attention"] = attention

    @property
    def attention(self) -> AttentionFn:
        """The :data:`AttentionFn` every attention layer calls."""
        return self.__dict__["_attention"]


def check_attention_args(
    q_SHD: torch.Tensor, k_SHD: torch.Tensor, cu_seqlens: torch.Tensor, causal: bool, window
) -> None:
    """Raise ``ValueError`` for a layout no path can run exactly."""
    total, _ = segment_bounds(cu_seqlens)
    if q_SHD.shape[0] != total:
        raise ValueError(
            f"packed sequence has {q_SHD.shape[0]} tokens but cu_seqlens ends at {total}"
        )
    if q_SHD.shape[1] % k_SHD.shape[1]:
        raise ValueError(
            f"{q_SHD.shape[1]} query heads are not a multiple of {k_SHD.shape[1]} key/value heads"
        )
    if window is not None and (not causal or int(window) < 1):
        raise ValueError(f"a sliding window needs causal attention and window >= 1, got {window}")


def attention_path(q_SHD: torch.Tensor, forced: str | None = None) -> str:
    """The path :func:`varlen_attention` takes for ``q_SHD``: one of :data:`PATHS`.

    On CUDA a varlen kernel always (PyTorch's ``varlen_attn`` for fp16/bf16, then
    flash-attn, else FlexAttention with a document mask); per-sample SDPA only on
    other devices, where no varlen kernel exists. ``forced``, else the environment
    variable ``DATACENTRIC_ATTENTION``, forces a path (an unavailable one is an
    error, never a silent fallback).
    """
    forced = (forced or os.environ.get(PATH_ENV, "")).strip().lower()
    if forced:
        if forced not in PATHS:
            raise ValueError(f"attention path {forced!r}: choose one of {', '.join(PATHS)}")
        available = available_paths(q_SHD)
        if forced not in available:
            raise ValueError(
                f"attention path {forced!r} cannot run {q_SHD.dtype} on "
                f"{q_SHD.device.type}; available here: {', '.join(available)}"
            )
        return forced
    return available_paths(q_SHD)[0]


def available_paths(q_SHD: torch.Tensor) -> list[str]:
    """Paths that can run ``q_SHD``'s device and dtype here, preferred first."""
    half = q_SHD.dtype in (torch.float16, torch.bfloat16)
    out = []
    if q_SHD.is_cuda:
        if _torch_varlen is not None and half:
            out.append("varlen")
        if _flash_varlen is not None and half:
            out.append("flash")
        if flex_attention is not None:
            out.append("flex")
    out.append("sdpa")
    return out


def varlen_attention(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    *,
    window: int | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """Attention within each segment of a packed sequence (see :class:`AttentionFn`).

    Runs the path :func:`attention_path` names, or ``path`` (one of :data:`PATHS`,
    an error where it cannot run); every path is exact (the same softmax over the
    same keys), and each is checked against :func:`math_attention`.
    """
    check_attention_args(q_SHD, k_SHD, cu_seqlens, causal, window)
    chosen = attention_path(q_SHD, forced=path)
    forced = path or os.environ.get(PATH_ENV, "").strip()
    if chosen in ("varlen", "flash") and not forced and window is None:
        long = _long_segments(q_SHD, cu_seqlens, causal)
        if long:
            return _split_by_length(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, long, chosen)
    return _KERNELS[chosen](q_SHD, k_SHD, v_SHD, cu_seqlens, causal, window)


#: One SDPA call against the varlen kernel on CUDA, measured on one H200 (torch 2.11,
#: bf16, forward + backward; ``benchmarks/gpu_bench.md``): SDPA ran a long segment
#: about 1.7x faster (one causal 32K segment 55 ms against 95 ms), but each call costs
#: about 1 ms more (228 clips of 144 tokens: 91 ms one call each, 2.5 ms in one varlen
#: call). Work units: segment length squared x heads x head dim, halved when causal.
SDPA_CALL_OVERHEAD_S = 1e-3
SDPA_UNITS_PER_S = 3.5e13
VARLEN_UNITS_PER_S = 2.1e13


def sdpa_is_faster(length: int, heads: int, head_dim: int, causal: bool) -> bool:
    """Whether one SDPA call beats the varlen kernel on a segment (CUDA, measured)."""
    units = length * length * heads * head_dim * (0.5 if causal else 1.0)
    return SDPA_CALL_OVERHEAD_S + units / SDPA_UNITS_PER_S < units / VARLEN_UNITS_PER_S


def _long_segments(q_SHD: torch.Tensor, cu_seqlens: torch.Tensor, causal: bool) -> list[int]:
    """Segments that run faster as their own SDPA call; none unless the layout's host
    offsets are known (reading a device tensor would stall the queue)."""
    if cu_seqlens.device.type != "cpu" and getattr(cu_seqlens, "host_offsets", None) is None:
        return []
    bounds = segment_offsets(cu_seqlens)
    heads, head_dim = q_SHD.shape[1], q_SHD.shape[2]
    return [
        i
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
        if sdpa_is_faster(b - a, heads, head_dim, causal)
    ]


def _split_by_length(q, k, v, cu_seqlens, causal, long, kernel):
    """Long segments one SDPA call each, every other segment in one ``kernel`` call."""
    bounds = segment_offsets(cu_seqlens)
    pieces: list[torch.Tensor | None] = [None] * (len(bounds) - 1)
    for i in long:
        a, b = bounds[i], bounds[i + 1]
        local = torch.tensor([0, b - a])
        local.host_offsets = (0, b - a)
        pieces[i] = _KERNELS["sdpa"](q[a:b], k[a:b], v[a:b], local, causal, None)
    short = [i for i in range(len(pieces)) if pieces[i] is None]
    if short:
        ranges = [(bounds[i], bounds[i + 1]) for i in short]
        offsets = [0]
        for a, b in ranges:
            offsets.append(offsets[-1] + b - a)
        local = host_to_device(torch.tensor(offsets), q.device)
        local.host_offsets = tuple(offsets)
        q_s, k_s, v_s = (torch.cat([t[a:b] for a, b in ranges]) for t in (q, k, v))
        out_s = _KERNELS[kernel](q_s, k_s, v_s, local, causal, None)
        for i, part in zip(short, out_s.split([b - a for a, b in ranges])):
            pieces[i] = part
    return torch.cat(pieces)  # type: ignore[arg-type]


def _lengths(cu_seqlens: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, int]:
    _, max_len = segment_bounds(cu_seqlens)  # host-side: no device read
    return cu_seqlens.to(device=device, dtype=torch.int32), max_len


@functools.cache
def _varlen_parameters() -> frozenset[str]:  # pragma: no cover - CUDA only
    """Keyword arguments the installed ``varlen_attn`` takes (2.10 has ``is_causal``;
    later releases ``window_size`` and ``enable_gqa``)."""
    return frozenset(inspect.signature(_torch_varlen).parameters)


def _torch_varlen_path(q, k, v, cu_seqlens, causal, window):  # pragma: no cover - CUDA only
    params = _varlen_parameters()
    if "window_size" not in params and window is not None:
        return _flex_path(q, k, v, cu_seqlens, causal, window)  # no window in this release
    if k.shape[1] != q.shape[1] and "enable_gqa" not in params:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    cu, max_len = _lengths(cu_seqlens, q.device)
    kwargs: dict[str, object] = {}
    if "window_size" in params:
        left = -1 if window is None else int(window) - 1
        kwargs["window_size"] = (left, 0) if causal else (-1, -1)
    else:
        kwargs["is_causal"] = causal
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    return _torch_varlen(q, k, v, cu, cu, max_len, max_len, **kwargs)


def _flash_path(q, k, v, cu_seqlens, causal, window):  # pragma: no cover - CUDA only
    cu, max_len = _lengths(cu_seqlens, q.device)
    left = -1 if window is None else int(window) - 1
    return _flash_varlen(q, k, v, cu, cu, max_len, max_len, causal=causal, window_size=(left, -1))


def document_ids(cu_seqlens: torch.Tensor, total: int, device: torch.device) -> torch.Tensor:
    """Segment index of every token of the packed sequence."""
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    return torch.bucketize(torch.arange(total, device=device), cu[1:], right=True)


def _flex_path(q, k, v, cu_seqlens, causal, window):
    block_mask = _document_block_mask(cu_seqlens, q.shape[0], causal, window, q.device)
    # (S, H, D) -> (1, H, S, D)
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    # Uncompiled, FlexAttention materialises the scores: on CUDA run the fused kernel.
    kernel = _compiled_flex() if q.is_cuda else flex_attention
    out = kernel(q4, k4, v4, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
    return out.squeeze(0).transpose(0, 1)


#: FlexAttention's block size (its default): masks are built per block of this many tokens.
FLEX_BLOCK = 128


@torch.compiler.disable  # eager, once per micro-batch: under compile too, never per layer
def _document_block_mask(cu_seqlens, total, causal, window, device):
    """FlexAttention's block mask of a packed layout, made once per micro-batch: kept
    with ``cu_seqlens`` (the same tensor reaches every layer, compiled or not)."""
    key = (total, causal, window, str(device))
    cache = getattr(cu_seqlens, "flex_masks", None)
    if cache is None:
        cache = cu_seqlens.flex_masks = {}
    if key not in cache:
        offsets = segment_offsets(cu_seqlens)
        cache[key] = document_block_mask(offsets, causal, window, device)
    return cache[key]


def document_block_mask(
    offsets: tuple[int, ...],
    causal: bool,
    window: int | None,
    device: torch.device | str,
    block: int = FLEX_BLOCK,
):
    """The ``BlockMask`` of segments at host ``offsets`` (``[0, len_0, ..., S]``), built
    block by block from each block's first and last segment: ``(S / block)^2`` block
    entries and ``O(S)`` per-token ids, never the ``S x S`` mask that
    ``create_block_mask`` evaluates uncompiled (1 GiB at 32K tokens). A block pair is
    *full* (no mask applied) when both blocks are whole and lie in one segment and the
    causal and window limits hold for every pair; *partial* (``mask_mod`` applied) when
    they may share a segment; skipped otherwise."""
    device = torch.device(device)
    total = int(offsets[-1])
    cu = torch.tensor(offsets, device=device, dtype=torch.long)
    starts = torch.arange(0, total, block, device=device)
    ends = torch.clamp(starts + block, max=total) - 1  # last token of each block
    first, last = (torch.bucketize(t, cu[1:], right=True) for t in (starts, ends))
    whole = ends - starts + 1 == block
    q_first, q_last, q_start, q_end = (t[:, None] for t in (first, last, starts, ends))
    k_first, k_last, k_start, k_end = (t[None, :] for t in (first, last, starts, ends))
    shared = (q_first <= k_last) & (k_first <= q_last)
    full = (q_first == q_last) & (k_first == k_last) & (q_first == k_first)
    full &= whole[:, None] & whole[None, :]
    if causal:
        shared &= k_start <= q_end
        full &= k_end <= q_start
    if window is not None:
        shared &= q_start - k_end < window
        full &= q_end - k_start < window
    doc = document_ids(cu, total, device)

    def mask_mod(b, h, q_idx, kv_idx):
        keep = doc[q_idx] == doc[kv_idx]
        if causal:
            keep = keep & (kv_idx <= q_idx)
        if window is not None:
            keep = keep & (q_idx - kv_idx < window)
        return keep

    def listed(blocks_QK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = blocks_QK.sum(dim=-1, dtype=torch.int32)
        order = torch.argsort((~blocks_QK).to(torch.int8), dim=-1, stable=True)
        return counts[None, None], order.to(torch.int32)[None, None]

    partial_num, partial_idx = listed(shared & ~full)
    full_num, full_idx = listed(full)
    return BlockMask.from_kv_blocks(
        partial_num,
        partial_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(total, total),
    )


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:  # pragma: no cover - CUDA only
    """FlexAttention compiled once per process (its fused kernel exists only compiled)."""
    return torch.compile(flex_attention, dynamic=True)


def _band_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    if window is None or window >= length:
        return None
    i = torch.arange(length, device=device)
    delta = i[:, None] - i[None, :]
    return (delta >= 0) & (delta < window)


@torch.compiler.disable  # a loop over segments: traced, it recompiles per sample count
def _sdpa_path(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, window):
    """One SDPA call per segment: the path for devices without a varlen kernel."""
    groups = q_SHD.shape[1] // k_SHD.shape[1]
    if groups > 1:  # grouped heads: SDPA's own enable_gqa is not in every supported torch
        k_SHD, v_SHD = (t.repeat_interleave(groups, dim=1) for t in (k_SHD, v_SHD))
    bounds = segment_offsets(cu_seqlens)
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        # (S, H, D) -> (1, H, S, D) for SDPA, then back.
        q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q_SHD, k_SHD, v_SHD))
        band = _band_mask(end - start, window, q.device)
        if band is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "varlen": _torch_varlen_path,
    "flash": _flash_path,
    "flex": _flex_path,
    "sdpa": _sdpa_path,
}


def math_attention(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    *,
    window: int | None = None,
) -> torch.Tensor:
    """The definition, written out: an explicit masked softmax per segment, in at least
    float32 (tests and checks only)."""
    check_attention_args(q_SHD, k_SHD, cu_seqlens, causal, window)
    groups = q_SHD.shape[1] // k_SHD.shape[1]
    dtype = torch.promote_types(q_SHD.dtype, torch.float32)
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        q_HSD, k_HSD, v_HSD = (
            t[start:end].to(dtype).transpose(0, 1) for t in (q_SHD, k_SHD, v_SHD)
        )
        k_HSD, v_HSD = (t.repeat_interleave(groups, dim=0) for t in (k_HSD, v_HSD))
        scores_HSS = q_HSD @ k_HSD.transpose(1, 2) / math.sqrt(q_SHD.shape[-1])
        i = torch.arange(end - start, device=q_SHD.device)
        delta = i[:, None] - i[None, :]
        keep = torch.ones_like(delta, dtype=torch.bool)
        if causal:
            keep &= delta >= 0
        if window is not None:
            keep &= delta < window
        scores_HSS = scores_HSS.masked_fill(~keep, float("-inf"))
        outs.append((scores_HSS.softmax(dim=-1) @ v_HSD).transpose(0, 1))
    return torch.cat(outs).to(q_SHD.dtype)
