"""Ulysses (all-to-all) sequence-parallel attention.

Shape legend: S = tokens of the full packed (padded) sequence, sp = ranks in the
SP group, H = heads, D = head dim. Each rank of a group holds a contiguous shard
of ``S / sp`` tokens. Attention needs whole sequences, so:

1. all-to-all: scatter heads, gather the sequence, ``(S/sp, H, D) -> (S, H/sp, D)``
   (q, k and v in one collective; with grouped-query attention k and v travel at
   their own ``Hkv`` heads when the group size divides ``Hkv``, and are repeated
   only as far as needed otherwise);
2. attend over the full sequence with the global ``cu_seqlens`` (varlen attention,
   so packed samples never see each other);
3. the reverse all-to-all, ``(S, H/sp, D) -> (S/sp, H, D)``.

Both all-to-alls are differentiable, their backward the opposite all-to-all, so
gradients flow back to every shard exactly. :func:`all_to_all_path` is the one
choice of how the collective runs (:data:`ALL_TO_ALL_PATHS`):

- ``functional``: ``torch.distributed._functional_collectives.
  all_to_all_single_autograd``, which ``torch.compile`` traces into the graph of a
  compiled block (no graph break at the collective); the default where torch has it;
- ``c10d``: ``torch.distributed.all_to_all_single`` inside an autograd Function,
  the fallback for a torch without the functional op. Dynamo traces it only by
  rewriting the in-place collective into the functional one (torch 2.13 does, with
  the same results); the functional path does not depend on that rewrite.

Both move the same values to the same places (pure data movement, no arithmetic),
so outputs and gradients are bit-identical between them; NCCL and gloo (CPU)
implement both, so the same code runs on GPUs and in CPU tests.

:class:`SequenceParallelAttention` is the callable injected once into a model
(``model.set_attention``); the runtime switches its group per micro-batch with
``with sp_attention.use(group): ...``. A group of ``None`` (or of one rank) is
plain attention.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

try:  # torch >= 2.4: differentiable functional all-to-all, traceable by dynamo
    from torch.distributed._functional_collectives import all_to_all_single_autograd
except ImportError:  # pragma: no cover - older torch
    all_to_all_single_autograd = None

from datacentric.batch import segment_bounds
from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.parallel.annotate import annotate, recording
from datacentric.parallel.groups import RingGroup
from datacentric.parallel.ring import ring_attention
from datacentric.planning.heads import check_sp_sizes, kv_head_repeat


def check_sp_compatible(num_heads: int, sp_sizes: Iterable[int], what: str = "attention") -> None:
    """Raise ``ValueError`` unless every SP size divides ``num_heads``.

    Ulysses splits heads across the group, so a model with ``num_heads`` query heads
    can only run on SP groups whose size divides it (key/value heads are repeated as
    far as a group needs: :mod:`datacentric.planning.heads`). ``what`` names the
    heads in the message.
    """
    check_sp_sizes(num_heads, None, sp_sizes, what)


def group_size(group: dist.ProcessGroup | None) -> int:
    """Ranks in ``group`` (1 for ``None``)."""
    return 1 if group is None else dist.get_world_size(group)


#: how the Ulysses all-to-all can run, preferred first (see :func:`all_to_all_path`)
ALL_TO_ALL_PATHS = ("functional", "c10d")
#: environment variable that forces one path (for checks and comparisons)
ALL_TO_ALL_ENV = "DATACENTRIC_ALL_TO_ALL"


def available_all_to_all_paths() -> list[str]:
    """The all-to-all paths this torch has, preferred first."""
    return [p for p in ALL_TO_ALL_PATHS if p != "functional" or all_to_all_single_autograd]


def all_to_all_path(forced: str | None = None) -> str:
    """How the Ulysses all-to-all runs: one of :data:`ALL_TO_ALL_PATHS`.

    ``functional`` where this torch has ``all_to_all_single_autograd`` (torch >= 2.4),
    else ``c10d``, the fallback for an older torch. ``forced``, else the environment
    variable ``DATACENTRIC_ALL_TO_ALL``, picks one (an unavailable one is an error,
    never a silent fallback). Both paths are checked on torch 2.13 with gloo (CPU):
    values and gradients bit-identical; a torch whose functional op fails on a backend
    raises there, and ``DATACENTRIC_ALL_TO_ALL=c10d`` runs the Autograd Function.
    """
    forced = (forced or os.environ.get(ALL_TO_ALL_ENV, "")).strip().lower()
    available = available_all_to_all_paths()
    if not forced:
        return available[0]
    if forced not in ALL_TO_ALL_PATHS:
        raise ValueError(f"all-to-all path {forced!r}: choose one of {', '.join(ALL_TO_ALL_PATHS)}")
    if forced not in available:
        raise ValueError(
            f"all-to-all path {forced!r} is not in torch {torch.__version__}; available: "
            f"{', '.join(available)}"
        )
    return forced


def all_to_all(
    x: torch.Tensor,
    scatter_dim: int,
    gather_dim: int,
    group: dist.ProcessGroup,
    *,
    path: str | None = None,
) -> torch.Tensor:
    """Differentiable all-to-all: split ``x`` into ``sp`` chunks along ``scatter_dim``,
    send chunk ``j`` to group rank ``j`` and concatenate the received chunks (in
    group-rank order) along ``gather_dim``; the gradient is the opposite all-to-all.

    ``path`` (default: :func:`all_to_all_path`) says how the collective runs; every
    path returns the same values.
    """
    if all_to_all_path(path) == "functional":
        return _all_to_all(x, scatter_dim, gather_dim, group, _functional_exchange)
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


def _c10d_exchange(send: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received


def _functional_exchange(send: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return all_to_all_single_autograd(send, None, None, group)


def _all_to_all(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup, exchange
) -> torch.Tensor:
    """:func:`all_to_all` with ``exchange(send, group)`` as the collective: ``send`` is
    ``(sp, ...)``, row ``j`` for group rank ``j``; it returns the rows received."""
    sp = dist.get_world_size(group)
    if x.shape[scatter_dim] % sp:
        raise ValueError(
            f"all-to-all over {sp} ranks cannot split dimension {scatter_dim} of size "
            f"{x.shape[scatter_dim]}"
        )
    send = torch.stack(x.chunk(sp, dim=scatter_dim)).contiguous()
    with annotate(f"all-to-all sp {sp} {list(send.shape)}" if recording() else ""):
        received = exchange(send, group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """The ``c10d`` path: ``dist.all_to_all_single`` with the opposite all-to-all as
    its gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        scatter_dim: int,
        gather_dim: int,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        ctx.scatter_dim, ctx.gather_dim, ctx.group = scatter_dim, gather_dim, group
        return _all_to_all(x, scatter_dim, gather_dim, group, _c10d_exchange)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        back = _all_to_all(grad, ctx.gather_dim, ctx.scatter_dim, ctx.group, _c10d_exchange)
        return back, None, None, None


def expand_kv_heads(kv_SHD: torch.Tensor, heads: int, sp: int) -> torch.Tensor:
    """Key/value heads repeated the least that a group of ``sp`` can split them.

    Unchanged when ``sp`` divides ``Hkv`` (grouped heads travel as they are); else
    each head is repeated ``r = kv_head_repeat(heads, Hkv, sp)`` times, which keeps
    query head ``h`` on key/value head ``h // (heads / (Hkv * r))``, the same head as
    before the repeat.
    """
    repeat = kv_head_repeat(heads, kv_SHD.shape[1], sp)
    return kv_SHD if repeat == 1 else kv_SHD.repeat_interleave(repeat, dim=1)


def all_gather(
    x: torch.Tensor, dim: int, group: dist.ProcessGroup, *, path: str | None = None
) -> torch.Tensor:
    """Differentiable all-gather: every rank's ``x`` concatenated along ``dim`` in
    group-rank order (all ranks' ``x`` must have the same shape).

    Runs as one :func:`all_to_all` that sends ``x`` to every rank, so its gradient is
    the opposite all-to-all followed by the sum of ``sp`` copies: each rank gets the
    sum over the group of the gradients of its own rows (a reduce-scatter), which is
    what a loss computed on every rank from the gathered rows needs.
    """
    sp = dist.get_world_size(group)
    if sp == 1:
        return x
    copies = x.unsqueeze(0).expand(sp, *x.shape).contiguous()
    received = all_to_all(copies, 0, 0, group, path=path)  # row j came from group rank j
    return torch.cat(received.unbind(0), dim=dim)


def heads_to_seq(
    x_SHD: torch.Tensor, group: dist.ProcessGroup, *, path: str | None = None
) -> torch.Tensor:
    """``(S, H/sp, D)`` full sequence, some heads -> ``(S/sp, H, D)`` shard of all heads."""
    return all_to_all(x_SHD, 0, 1, group, path=path)


def seq_to_heads(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    path: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S/sp, H, D)`` shards of q, k, v -> the whole sequence of ``H/sp`` heads each, in
    one all-to-all (k and v at their own head count, repeated only as far as needed)."""
    sp = group_size(group)
    k_SHD, v_SHD = (expand_kv_heads(t, q_SHD.shape[1], sp) for t in (k_SHD, v_SHD))
    heads, kv_heads = q_SHD.shape[1], k_SHD.shape[1]
    # One all-to-all for q, k and v: per destination rank, its query heads then its
    # key/value heads, (S/sp, sp, (H + 2 Hkv)/sp, D) -> (S, (H + 2 Hkv)/sp, D).
    # Local query head j then reads local key/value head j // (H / Hkv), as globally.
    per_rank = [t.unflatten(1, (sp, t.shape[1] // sp)) for t in (q_SHD, k_SHD, v_SHD)]
    qkv_SHD = all_to_all(torch.cat(per_rank, dim=2).flatten(1, 2), 1, 0, group, path=path)
    q, k, v = qkv_SHD.split([heads // sp, kv_heads // sp, kv_heads // sp], dim=1)
    return q, k, v


def ulysses_attention(
    q_SHD: torch.Tensor,
    k_SHD: torch.Tensor,
    v_SHD: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    group: dist.ProcessGroup | None,
    attention: AttentionFn = varlen_attention,
    *,
    window: int | None = None,
    path: str | None = None,
    ring: RingGroup | None = None,
) -> torch.Tensor:
    """Attention over a sequence sharded across ``group``; returns this rank's shard.

    ``q/k/v_SHD`` are this rank's ``(S/sp, H, D)`` shard (contiguous tokens, in
    group-rank order); ``cu_seqlens`` describes the full padded sequence of ``S``
    tokens. ``attention`` is the single-process kernel run on ``(S, H/sp, D)``.
    With ``group`` of ``None`` or one rank this is ``attention`` itself. ``path`` says
    how the all-to-alls run (:func:`all_to_all_path`).

    With a ``ring`` of ``r > 1`` positions (a hybrid group, ``parallel.ring``), the
    ranks of ``group`` hold the ``S/r`` tokens of ring position ``ring.index`` instead
    (``ring_layout``), the all-to-all gathers those, and ring attention replaces
    ``attention``.
    """
    sp = group_size(group)
    ring_size = 1 if ring is None else ring.size
    extra = {} if window is None else {"window": window}  # plain callables need no keyword
    if sp == 1:
        if ring_size == 1:
            return attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, **extra)
        return ring_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, ring, window=window)
    check_sp_compatible(q_SHD.shape[1], [sp], "query")
    full, _ = segment_bounds(cu_seqlens)
    if q_SHD.shape[0] * sp * ring_size != full:
        raise ValueError(
            f"shard of {q_SHD.shape[0]} tokens on {sp * ring_size} ranks does not cover the "
            f"packed sequence of {full} tokens (pad the sequence to a multiple of the SP size)"
        )
    q, k, v = seq_to_heads(q_SHD, k_SHD, v_SHD, group, path=path)
    if ring_size == 1:
        out_SHD = attention(q, k, v, cu_seqlens, causal, **extra)
    else:
        out_SHD = ring_attention(q, k, v, cu_seqlens, causal, ring, window=window)
    return heads_to_seq(out_SHD, group, path=path)


class SequenceParallelAttention:
    """An :data:`AttentionFn` whose SP group is switched per micro-batch.

    Inject it once (``model.set_attention(sp_attention)``); then
    ``with sp_attention.use(group): loss = model(shard)`` runs Ulysses attention
    on ``group`` (plain ``attention`` when the group is ``None`` or has one rank);
    ``use(group, ring)`` runs Ulysses on ``group`` inside ``ring`` (a hybrid group,
    ``ProcessGroups.split``).
    Keep the backward pass inside the same ``use`` block: recomputed blocks call
    attention again during backward. ``all_to_all`` picks the collective's path
    (default: :func:`all_to_all_path`, resolved here once, outside any compiled code).
    """

    def __init__(
        self, attention: AttentionFn = varlen_attention, *, all_to_all: str | None = None
    ) -> None:
        self.attention = attention
        self.all_to_all = all_to_all_path(all_to_all)
        """How the all-to-alls run: one of :data:`ALL_TO_ALL_PATHS`."""
        self.group: dist.ProcessGroup | None = None
        self.ring: RingGroup | None = None

    @property
    def sp_size(self) -> int:
        """Ranks in the current group (Ulysses ranks times ring positions)."""
        return group_size(self.group) * (1 if self.ring is None else self.ring.size)

    @property
    def rank_in_group(self) -> int:
        """This rank's index in the current group (0 for ``None``)."""
        return 0 if self.group is None else dist.get_rank(self.group)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """:func:`all_gather` of ``x`` along ``dim`` over the current group (``x`` itself
        for a group of one). Models that split a sequence themselves (their own
        context-parallel plan) gather through it."""
        if self.sp_size == 1:
            return x
        return all_gather(x, dim, self.group, path=self.all_to_all)

    @contextmanager
    def use(
        self, group: dist.ProcessGroup | None, ring: RingGroup | None = None
    ) -> Iterator[SequenceParallelAttention]:
        """Run attention on ``group`` (inside ``ring``, if one) within the block; restore
        the previous group after."""
        previous, self.group, self.ring = (self.group, self.ring), group, ring
        try:
            yield self
        finally:
            self.group, self.ring = previous

    def __call__(
        self,
        q_SHD: torch.Tensor,
        k_SHD: torch.Tensor,
        v_SHD: torch.Tensor,
        cu_seqlens: torch.Tensor,
        causal: bool,
        *,
        window: int | None = None,
    ) -> torch.Tensor:
        return ulysses_attention(
            q_SHD,
            k_SHD,
            v_SHD,
            cu_seqlens,
            causal,
            group=self.group,
            attention=self.attention,
            window=window,
            path=self.all_to_all,
            ring=self.ring,
        )

    def __repr__(self) -> str:
        return (
            f"SequenceParallelAttention(sp_size={self.sp_size}, "
            f"ring={1 if self.ring is None else self.ring.size}, attention={self.attention!r}, "
            f"all_to_all={self.all_to_all!r})"
        )
