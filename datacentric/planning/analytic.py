"""An analytic cost model: FLOPs and bytes of a :class:`ModelSpec` on a :class:`Hardware`.

Time of one micro-batch pass on one rank of an SP group of ``sp`` ranks::

    t = matmul_flops / (peak * matmul_eff * sat(tokens_per_rank))
      + attention_fwd_flops / (peak * attention_eff)
      + attention_bwd_flops / (peak * attention_backward_eff)
      + elementwise_bytes / (mem_bw * mem_eff)
      + a2a_bytes_nvlink / (nvlink_bw * net_eff) + a2a_bytes_ib / (ib_bw * net_eff)
      + collectives * collective_latency + block_passes * block_overhead
      + segment_passes * segment_overhead[path] + segment_copy_bytes * copy_rate[path]
      + scattered_elements * scatter_rate + modulation_elements * modulation_rate
      + recomputed_blocks * recompute_overhead + outer_ops * op_launch

with ``sat(t) = t / (t + half_efficiency_tokens)`` (small GEMMs under-fill the
device). Work counted per block and pass:

- *forward*: linear layers ``2 * params * tokens``; self-attention
  ``4 * hidden * pairs`` where ``pairs`` is ``s^2`` (full), ``s(s+1)/2`` (causal),
  ``frames * (h*w)^2`` (spatial) or ``h*w * frames^2`` (temporal) per sample;
  cross-attention ``4 * hidden * s * cond_tokens``; everything per rank is ``1/sp``
  of the sample's (Ulysses splits heads, frame-sharding splits frames) except the
  conditioning tokens' k/v projections, which every rank of a group repeats;
- *backward*: 2x the forward's linear FLOPs and element-wise bytes, 2.5x its
  attention FLOPs (FlashAttention-2's backward runs 5 matmuls to the forward's 2);
- *recomputation*: one more forward of every recomputed block (its all-to-alls too);
- *all-to-all* (SP > 1): ``ulysses``: q, k and v to head shards (one stacked
  all-to-all, three with grouped-query attention) and the output back, per
  self-attention forward, as many in backward, moving ``(sp-1)/sp`` of the local
  tensors; ``frame-sharded``:
  none for spatial blocks when ``frames % sp == 0``, 2 of the hidden state for
  temporal blocks. Groups of at most ``gpus_per_node`` ranks use NVLink; a larger
  group sends ``(sp - gpn)/(sp - 1)`` of its bytes over InfiniBand (the two
  transfers are charged one after the other: conservative).

Memory on one rank (bytes):

- model states: as the run's ``shard`` setting holds them on ``world_size`` ranks
  (:meth:`~datacentric.planning.sharding.ShardingSpec.model_state_bytes`: replicated
  for ``none``/``ddp``; optimizer state split over the world for ``fsdp2``);
- saved activations: per non-recomputed block ``saved_elems * tokens/sp * dtype``
  (see :meth:`ModelSpec.saved_elements_per_token`), per recomputed block only its input
  ``hidden * tokens/sp * dtype``; conditioning k/v per sample, not sharded;
- transient peak: the larger of the loss head (LM: three float32 ``tokens/sp x vocab``
  tensors in log_softmax's backward, 12 bytes a logit) and, in backward, one
  recomputed block's full activations plus the gradient working set
  (``(2 hidden + ffn) * tokens/sp * dtype``).

Terms fitted to measurement (``datacentric calibrate``; see docs/planning.md):

- *segments*: every sample of a micro-batch is one attention segment; each attention
  pass (forward, recomputed forward, backward counted twice) costs
  ``segments * segment_overhead`` of the attention path the hardware names. On the
  ``sdpa-per-sample`` path each segment's slice backward also writes a full-size
  gradient of q, k and v: ``segments * tokens/sp * (h + 2 kv) * dtype`` bytes per
  backward of a block (this is what makes 128 short samples dearer than one long one);
- *modulation* (DiT adaLN): ``per_token_modulation`` elements per token and block pass
  of traffic, plus a backward scatter-add serialised along each sample (elements:
  ``per_token_modulation * token-weighted mean sample length``);
- *recomputation*: a fixed ``recompute_overhead`` per recomputed block beyond its forward;
- *launches*: ``outer_ops`` operators outside the blocks per pass;
- *weight traffic* (memory bytes): the fp32 weights' 16-bit copies and gradient
  accumulation under mixed precision (:func:`weight_traffic_bytes`), per block pass,
  not divided by ``sp`` (every rank holds the weights).

Breakdowns are cached per (shapes, sp, recomputed count per block kind): compute is
the pass without recomputation less its all-to-all, recomputation what the recomputed
blocks add (their all-to-all included).

Where each part lives: the units of a pass's work (:class:`Work`,
:func:`weight_traffic_bytes`) and what the formulas read of a micro-batch's shapes
(:func:`attention_pairs`, :func:`shape_sums`) in :mod:`~datacentric.planning.pass_work`;
the formulas of one pass, time, memory and their floor, in
:mod:`~datacentric.planning.analytic_formulas`; hybrid groups (a ring over Ulysses
groups) in :mod:`~datacentric.planning.analytic_ring`. Here: the cost model, its caches
and the one reading of its settings (:func:`analytic_model`). Every public name this
module held before is still importable from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from datacentric.planning.analytic_formulas import ATTENTION_BACKWARD_FACTOR, PassFormulas
from datacentric.planning.analytic_ring import RING_KINDS, RingPricing
from datacentric.planning.cost_model import BREAKDOWN_CACHE_SIZE, CachedCostModel, PassBreakdown
from datacentric.planning.hardware import Hardware
from datacentric.planning.memory_cap import resolve_memory_cap, warn_cost_model_cap
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.pass_work import (
    Work,
    _ShapeSums,
    attention_pairs,
    shape_sums,
    text_shape_sums,
    weight_traffic_bytes,
)
from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.shapes import SampleShape

#: every public name this module held before its parts moved (each the object of its home)
__all__ = [
    "ATTENTION_BACKWARD_FACTOR",
    "AnalyticCostModel",
    "COMM_COLUMNS",
    "RING_KINDS",
    "Work",
    "analytic_model",
    "attention_pairs",
    "shape_sums",
    "text_shape_sums",
    "weight_traffic_bytes",
]

#: Entries of :meth:`Work.as_array` that are communication (NVLink, InfiniBand, calls).
COMM_COLUMNS = slice(3, 6)


class AnalyticCostModel(RingPricing, PassFormulas, CachedCostModel):
    """Implements :class:`~datacentric.planning.cost_model.CostModel` from FLOPs and bytes."""

    #: Text passes are priced from :func:`shape_sums` alone (integer sums; the one other
    #: read of the shapes, frame-sharding, is false for every text pass).
    prices_text_by_sums = True

    def __init__(
        self,
        spec: ModelSpec,
        hardware: Hardware,
        memory_fraction: float | None = None,
        dtype_bytes: int = 2,
        *,
        grad_bytes: int | None = None,
        optimizer_bytes_per_param: int | None = None,
        sharding: ShardingSpec | None = None,
        world_size: int = 1,
        grad_sync_overlap: float = 0.0,
        memory_capacity_bytes: int | None = None,
    ) -> None:
        """``memory_fraction`` and ``memory_capacity_bytes``: deprecated and unused by
        the planner, the scheduler and the simulator; the budget is the plan's (resolved
        by :func:`~datacentric.planning.memory_cap.resolve_memory_cap`). The model only
        prices memory.
        ``grad_bytes``: bytes per gradient element (default ``dtype_bytes``).
        ``optimizer_bytes_per_param``: Adam moments (8) plus an fp32 master copy when
        training in 16 bits (default 12 if ``dtype_bytes == 2`` else 8).
        ``sharding`` on ``world_size`` ranks: how model state is held (default
        :data:`~datacentric.planning.sharding.DEFAULT_SHARD`; one rank holds it all).
        ``grad_sync_overlap``: share of the gradient all-reduce hidden behind backward."""
        if not 0 <= grad_sync_overlap <= 1:
            raise ValueError(f"grad_sync_overlap must be in [0, 1], got {grad_sync_overlap}")
        self.spec = spec
        self.hardware = hardware
        self.dtype_bytes = dtype_bytes
        self.grad_bytes = dtype_bytes if grad_bytes is None else grad_bytes
        self.optimizer_bytes_per_param = (
            (12 if dtype_bytes == 2 else 8)
            if optimizer_bytes_per_param is None
            else optimizer_bytes_per_param
        )
        self.sharding = sharding or ShardingSpec()
        self.world_size = world_size
        self.grad_sync_overlap = grad_sync_overlap
        self._kinds = spec.kinds
        self._kind_index = {k: i for i, k in enumerate(self._kinds)}
        self._kind_counts = tuple(spec.kind_counts()[k] for k in self._kinds)
        self._saved_elems = spec.saved_elements_per_token()
        self._rates = hardware.seconds_per_unit()
        if memory_fraction is not None or memory_capacity_bytes is not None:
            warn_cost_model_cap("AnalyticCostModel(memory_fraction=, memory_capacity_bytes=)")
        fraction = {} if memory_fraction is None else {"fraction": memory_fraction}
        self._legacy_cap = (
            int(memory_capacity_bytes)
            if memory_capacity_bytes is not None
            else resolve_memory_cap(None, hardware.memory_bytes, **fraction)
        )

    # --- CostModel protocol ---------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.spec.num_blocks

    @property
    def block_kinds(self) -> tuple[str, ...]:
        """Kind of every block (the planner groups the recomputation knapsack by it)."""
        return self.spec.block_kinds

    @property
    def memory_capacity_bytes(self) -> int:
        """Deprecated: the budget is the plan's (:mod:`datacentric.planning.memory_cap`)."""
        warn_cost_model_cap("AnalyticCostModel.memory_capacity_bytes")
        return self._legacy_cap

    @property
    def gpus_per_node(self) -> int:
        return self.hardware.gpus_per_node

    def supports_sp_size(self, sp_size: int) -> bool:
        """Ulysses splits heads: ``sp_size`` must divide the number of heads."""
        return sp_size >= 1 and self.spec.heads % sp_size == 0

    def recompute_key(self, recompute: Sequence[bool]) -> Hashable:
        """Recomputed blocks per kind (which blocks of a kind does not matter)."""
        return self._counts(recompute)

    def _sums(self, shapes: tuple[SampleShape, ...]) -> _ShapeSums:
        """:func:`shape_sums` of ``shapes``; the last answer is kept, so the several
        formulas of one pass (with and without recomputation, memory) sum them once
        (one tuple, checked by identity, swapped atomically for threads)."""
        last = self.__dict__.get("_last_sums")
        if last is not None and last[0] is shapes:
            return last[1]
        known = self.__dict__.get("_last_text_sums")  # the cache key just made of them
        sums = None
        if known is not None and known[0] is shapes:
            sums = text_shape_sums(self._kinds, *known[1][1:])
        if sums is None:
            sums = shape_sums(self._kinds, shapes)
        self._last_sums = (shapes, sums)
        return sums

    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        counts: tuple[int, ...] = key  # type: ignore[assignment]
        comm_s, plain_s = self._plain(shapes, sp_size, len(counts))
        if any(counts):
            time_s = float(self._work(shapes, sp_size, counts).as_array() @ self._rates)
        else:
            time_s = plain_s
        return PassBreakdown(
            time_s=time_s,
            compute_s=plain_s - comm_s,
            recompute_s=time_s - plain_s,
            comm_s=comm_s,
            memory_bytes=self._memory(shapes, sp_size, counts),
        )

    def _plain(
        self,
        shapes: tuple[SampleShape, ...],
        sp: int,
        kinds: int,
        ulysses: int | None = None,
        ring: int = 1,
    ) -> tuple[float, float]:
        """The pass recomputing nothing: its communication and total seconds (a ring's
        exposed transfer in both), kept per pass (text by its sums, the cache key just
        made of these shapes; else by the shapes): every recomputation setting of a pass
        prices it again (the knapsack asks three or four of one sample). Kept while the
        model's spec, hardware, element size and rates are the same objects (what they
        read)."""
        kept = self.__dict__.get("_plain_passes")
        spec, hardware, size, rates = self.spec, self.hardware, self.dtype_bytes, self._rates
        if (
            kept is None
            or kept[0] is not spec
            or kept[1] is not hardware
            or kept[2] != size
            or kept[3] is not rates
        ):
            kept = (spec, hardware, size, rates, {})
            object.__setattr__(self, "_plain_passes", kept)
        memo: dict[tuple, tuple[float, float]] = kept[4]
        known = self.__dict__.get("_last_text_sums")
        which = known[1] if known is not None and known[0] is shapes else shapes
        key = (which, sp, ulysses, kinds, ring)
        found = memo.get(key)
        if found is None:
            plain = self._work(shapes, sp, (0,) * kinds, ulysses).as_array()
            comm_s = float(plain[COMM_COLUMNS] @ rates[COMM_COLUMNS])
            plain_s = float(plain @ rates)
            if ring > 1:
                exposed = self._ring_exposed_s(shapes, sp, ring, (0,) * kinds)
                comm_s, plain_s = comm_s + exposed, plain_s + exposed
            found = (comm_s, plain_s)
            if len(memo) >= BREAKDOWN_CACHE_SIZE:
                memo.clear()
            memo[key] = found
        return found

    def compute_memory_bytes(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> int:
        """The breakdown's ``memory_bytes`` alone (memory needs no time formula)."""
        if not shapes:
            raise ValueError("a micro-batch needs at least one sample")
        if sp_size < 1:
            raise ValueError(f"sp_size must be >= 1, got {sp_size}")
        return self._memory(shapes, sp_size, key)  # type: ignore[arg-type]

    def grad_sync_time_s(self, world_size: int) -> float:
        """Ring all-reduce of all gradients over ``world_size`` ranks (ZeRO-2's
        reduce-scatter plus parameter all-gather moves the same bytes), minus the
        share ``grad_sync_overlap`` hidden behind the last backward."""
        if world_size <= 1:
            return 0.0
        hw = self.hardware
        n = world_size
        volume = 2.0 * (n - 1) / n * self.spec.trained_params * self.grad_bytes
        bandwidth = hw.intra_node_bandwidth if n <= hw.gpus_per_node else hw.inter_node_bandwidth
        seconds = volume / (bandwidth * hw.network_efficiency)
        seconds += 2 * (n - 1) * hw.collective_latency_s
        return seconds * (1.0 - self.grad_sync_overlap)

    # --- extras ---------------------------------------------------------------------------
    def model_state_bytes(self) -> int:
        """Parameters, gradients and optimizer state held by one rank (its ``sharding``;
        kept while the settings it reads are the same: every pass's memory asks)."""
        settings = (
            self.spec,
            self.sharding,
            self.world_size,
            self.dtype_bytes,
            self.grad_bytes,
            self.optimizer_bytes_per_param,
        )
        kept = self.__dict__.get("_state_bytes")
        if kept is not None and kept[0] == settings:
            return kept[1]
        found = self.sharding.model_state_bytes(
            self.spec.num_params,
            self.world_size,
            param_bytes=self.dtype_bytes,
            grad_bytes=self.grad_bytes,
            optimizer_bytes=self.optimizer_bytes_per_param,
            trainable_params=self.spec.trained_params,
        )
        self._state_bytes = (settings, found)
        return found

    def _counts(self, recompute: Sequence[bool]) -> tuple[int, ...]:
        """Recomputed blocks per kind (kept per flags tuple: every pass asks)."""
        memo = self.__dict__.setdefault("_counts_of", {})
        found = memo.get(recompute) if isinstance(recompute, tuple) else None
        if found is None:
            found = self._count(recompute)
            if isinstance(recompute, tuple) and len(memo) < 4096:
                memo[recompute] = found
        return found

    def _count(self, recompute: Sequence[bool]) -> tuple[int, ...]:
        if not recompute:
            return (0,) * len(self._kinds)
        if len(recompute) != self.spec.num_blocks:
            raise ValueError(
                f"recompute has {len(recompute)} entries for {self.spec.num_blocks} blocks"
            )
        counts = [0] * len(self._kinds)
        for kind, r in zip(self.spec.block_kinds, recompute):
            if r:
                counts[self._kind_index[kind]] += 1
        return tuple(counts)


def on_nodes_of(hardware: Hardware, ranks_per_node: int | None) -> Hardware:
    """``hardware`` on the nodes a run has: a node of the lesser of its
    ``gpus_per_node`` and the run's ``ranks_per_node`` (torchrun ``--nproc-per-node 4``
    on 8-GPU nodes: groups of more than 4 ranks cross nodes); ``None``: its own node."""
    if ranks_per_node is None or ranks_per_node >= hardware.gpus_per_node:
        return hardware
    return dataclasses.replace(hardware, gpus_per_node=max(1, int(ranks_per_node)))


def analytic_model(
    spec: ModelSpec,
    hardware: Hardware,
    *,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
    ranks_per_node: int | None = None,
) -> AnalyticCostModel:
    """The analytic model of ``spec`` on ``hardware``: the one place its settings are read.

    ``dtype_bytes`` defaults to 4 (fp32) on ``cpu-local`` and 2 (bf16) elsewhere.
    ``shard`` on ``world_size`` ranks: how model state is held (a
    :class:`~datacentric.planning.sharding.ShardingSpec` or its mode; default
    :data:`~datacentric.planning.sharding.DEFAULT_SHARD`). ``grad_sync_overlap``: share
    of the gradient reduction hidden behind backward (0: the model reports all of it).
    ``ranks_per_node``: the run's ranks on each node; groups of more are priced across
    nodes where the preset's node is larger (:func:`on_nodes_of`; None: the preset's node).
    """
    if dtype_bytes is None:
        dtype_bytes = 4 if hardware.name == "cpu-local" else 2
    sharding = shard if isinstance(shard, ShardingSpec) else ShardingSpec(shard or DEFAULT_SHARD)
    return AnalyticCostModel(
        spec,
        on_nodes_of(hardware, ranks_per_node),
        dtype_bytes=dtype_bytes,
        sharding=sharding,
        world_size=world_size,
        grad_sync_overlap=grad_sync_overlap,
    )
