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

*Hybrid groups* (a ring of ``r`` positions over Ulysses groups of ``u = sp / r``;
:meth:`AnalyticCostModel.compute_split_breakdown`, text blocks only): the all-to-all
above runs over ``u`` ranks (NVLink when ``u <= gpus_per_node``, else the share
``(u - gpn)/(u - 1)`` over InfiniBand), moving ``(u-1)/u`` of the local tensors;
attention FLOPs stay ``1/sp`` of the sample's (documents sharded zigzag, so every ring
step does about ``1/r`` of a rank's attention). Each attention pass runs ``r - 1``
ring steps; a forward step sends one chunk of K/V (``tokens/r`` tokens at the K/V
heads a Ulysses rank holds, repeated as :func:`~datacentric.planning.heads.kv_head_repeat`
says), a backward step K/V and their float32 gradient accumulators, which one more send
brings home after the last step (not overlapped). A step's transfer overlaps the share
``Hardware.ring_overlap`` (default 0.8, conservative) of that step's attention compute;
only ``max(0, transfer - ring_overlap * compute)`` is charged, plus two collective
latencies per send. The ring's links are NVLink when the whole group fits in a
node, else InfiniBand (the steps are synchronous: the slowest hop sets their pace).
Memory adds the ring's buffers: two K/V chunks in flight, their gradients, and the
fp32 output accumulator of the online softmax. Approximate: per-step compute of
packed documents is taken as uniform.

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

The units of a pass's work (:class:`Work`, :func:`weight_traffic_bytes`) and what the
formulas read of a micro-batch's shapes (:func:`attention_pairs`, :func:`shape_sums`)
live in :mod:`~datacentric.planning.pass_work`; every public name this module held
before is still importable from it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from datacentric.planning.cost_model import BREAKDOWN_CACHE_SIZE, CachedCostModel, PassBreakdown
from datacentric.planning.hardware import Hardware
from datacentric.planning.heads import kv_head_repeat
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

#: every public name this module held before its pass's work moved (each the object of its home)
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

ATTENTION_BACKWARD_FACTOR = 2.5  # FlashAttention-2 backward: 5 matmuls vs 2 in forward
#: Entries of :meth:`Work.as_array` that are communication (NVLink, InfiniBand, calls).
COMM_COLUMNS = slice(3, 6)
#: Indices of :meth:`Work.as_array` the ring's overlap reads.
_ATTN_FWD, _NVLINK, _IB, _CALL, _ATTN_BWD = 1, 3, 4, 5, 7
#: Block kinds a ring can run (text attention over packed documents).
RING_KINDS = frozenset({"causal", "full"})


@dataclass
class _PassSums:
    """Running sums of one pass's work while :meth:`AnalyticCostModel._work` adds it up."""

    mm: float = 0.0
    attn: float = 0.0
    attn_bwd: float = 0.0
    mem: float = 0.0
    nvl: float = 0.0
    ib: float = 0.0
    colls: int = 0
    passes: int = 0
    segment_passes: float = 0.0
    modulation: float = 0.0
    scattered: float = 0.0


class AnalyticCostModel(CachedCostModel):
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

    def supports_split(self, sp_size: int, ring_size: int) -> bool:
        """Whether ``sp_size`` ranks run as ``sp_size / ring_size`` Ulysses ranks (dividing
        the heads) times a ring of ``ring_size``; rings only for text blocks, and no
        larger than the spec's ``max_ring_size`` when it has one."""
        if ring_size < 1 or sp_size % ring_size:
            return False
        if 0 < self.spec.max_ring_size < ring_size:
            return False
        if ring_size > 1 and not set(self._kinds) <= RING_KINDS:
            return False
        return self.supports_sp_size(sp_size // ring_size)

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

    def compute_split_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> PassBreakdown:
        """A pass on a ring of ``ring_size`` over Ulysses groups of ``sp_size / ring_size``
        (see the module doc): the Ulysses pass over the smaller all-to-all, plus each ring
        step's transfer where it outlasts that step's attention compute."""
        if not self.supports_split(sp_size, ring_size):
            raise ValueError(
                f"{self.spec.name}: cannot split SP {sp_size} into a ring of {ring_size} "
                f"({self.spec.heads} heads must be divisible by {sp_size // max(ring_size, 1)}, "
                "and rings run text blocks only)"
            )
        counts: tuple[int, ...] = key  # type: ignore[assignment]
        ulysses = sp_size // ring_size
        comm_s, plain_s = self._plain(shapes, sp_size, len(counts), ulysses, ring_size)
        if any(counts):
            work = self._work(shapes, sp_size, counts, ulysses).as_array()
            time_s = float(work @ self._rates)
            time_s += self._ring_exposed_s(shapes, sp_size, ring_size, counts)
        else:
            time_s = plain_s
        return PassBreakdown(
            time_s=time_s,
            compute_s=plain_s - comm_s,
            recompute_s=time_s - plain_s,
            comm_s=comm_s,
            memory_bytes=self._ring_memory(shapes, sp_size, ring_size, counts),
            inter_node_backward_s=self._ring_backward_link_s(shapes, sp_size, ring_size),
        )

    def compute_split_memory_bytes(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> int:
        """The ring breakdown's ``memory_bytes`` alone (no time formula)."""
        if not self.supports_split(sp_size, ring_size):
            return self.compute_split_breakdown(shapes, sp_size, ring_size, key).memory_bytes
        if not shapes:
            raise ValueError("a micro-batch needs at least one sample")
        return self._ring_memory(shapes, sp_size, ring_size, key)  # type: ignore[arg-type]

    def _ring_memory(
        self, shapes: tuple[SampleShape, ...], sp: int, ring: int, counts: tuple[int, ...]
    ) -> int:
        """Peak bytes of a pass on a ring: the Ulysses pass's plus the ring's buffers
        (K/V chunks in flight, their gradients, the float32 output)."""
        chunk = self._ring_chunk_bytes(shapes, sp, ring)
        local = self._sums(shapes).tokens / sp
        buffers = 4 * chunk + 4 * local * self.spec.hidden
        return self._memory(shapes, sp, counts) + int(buffers)

    def _ring_chunk_bytes(self, shapes: tuple[SampleShape, ...], sp: int, ring: int) -> float:
        """Bytes of the K/V chunk one ring step sends: ``tokens / ring`` tokens at the
        key/value heads one Ulysses rank of ``sp / ring`` holds."""
        spec = self.spec
        ulysses = sp // ring
        kv_heads = spec.kv_heads or spec.heads
        held = kv_heads * kv_head_repeat(spec.heads, kv_heads, ulysses) / ulysses
        tokens = self._sums(shapes).tokens if shapes else 0
        return 2.0 * tokens / ring * held * spec.head_dim * self.dtype_bytes

    def _ring_exposed_s(
        self,
        shapes: tuple[SampleShape, ...],
        sp: int,
        ring: int,
        counts: tuple[int, ...],
        floor: bool | None = None,
    ) -> float:
        """Seconds of ring transfer not hidden behind attention compute: per forward of
        a block (recomputed ones too) and per backward, ``ring - 1`` steps. ``floor``
        (:meth:`pass_floor`): ``False`` leaves the steps' exposed transfer out, ``True``
        charges it unclipped (it may be negative: ``max(0, x) >= x``)."""
        rates = self._rates
        chunk = self._ring_chunk_bytes(shapes, sp, ring)
        per_byte = rates[_NVLINK] if sp <= self.hardware.gpus_per_node else rates[_IB]
        steps = ring - 1
        blocks = self.spec.num_blocks
        forwards = blocks + sum(counts)
        flops = self._attention_flops_per_pass(shapes, sp)
        fwd_step = flops * rates[_ATTN_FWD] / ring
        bwd_step = flops * ATTENTION_BACKWARD_FACTOR * rates[_ATTN_BWD] / ring
        grads = chunk * 4 / self.dtype_bytes  # the blocks' float32 gradient accumulators
        hidden = self.hardware.ring_overlap  # the share of a step's compute that hides
        fwd = chunk * per_byte - hidden * fwd_step
        bwd = (chunk + grads) * per_byte - hidden * bwd_step
        if floor is None:
            fwd, bwd = max(0.0, fwd), max(0.0, bwd)
        elif not floor:
            fwd = bwd = 0.0
        exposed = forwards * steps * fwd + blocks * steps * bwd
        exposed += blocks * grads * per_byte  # the last send brings the gradients home
        return float(exposed + 2 * ring * rates[_CALL] * (forwards + blocks))

    def _ring_backward_link_s(self, shapes: tuple[SampleShape, ...], sp: int, ring: int) -> float:
        """Seconds the backward's ring sends (K/V with their float32 gradients, ``ring - 1``
        steps per block, and the gradients' last send home) hold the inter-node link; 0
        for a ring within a node."""
        if ring <= 1 or sp <= self.hardware.gpus_per_node:
            return 0.0
        chunk = self._ring_chunk_bytes(shapes, sp, ring)
        grads = chunk * 4 / self.dtype_bytes
        per_pass = (ring - 1) * (chunk + grads) + grads
        return float(self.spec.num_blocks * per_pass * self._rates[_IB])

    def _attention_flops_per_pass(self, shapes: tuple[SampleShape, ...], sp: int) -> float:
        """Attention forward FLOPs of one block's forward on one rank (blocks alike)."""
        if not shapes:
            return 0.0
        sums = self._sums(shapes)
        pairs = sums.pairs[self._kind_index[self.spec.block_kinds[0]]]
        return 4.0 * self.spec.hidden * (pairs + sums.tokens * self.spec.cross_attn_tokens) / sp

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

    def pass_floor(
        self,
        shapes: Sequence[SampleShape],
        sp_size: int,
        recompute: Sequence[bool],
        *,
        ring_size: int = 1,
        ring_linear: bool = False,
    ) -> tuple[float, float]:
        """Seconds and bytes of a pass of ``shapes`` (possibly none) that its time and
        memory are never below, and that grow at least by each sample's own share when
        samples join (the contract of :func:`~datacentric.planning.proved_price.proved_prices`):
        the time formula without GEMM saturation (``sat <= 1`` only divides), without
        the serialised modulation scatter (never negative, not additive over samples)
        and without a ring step's exposed transfer ``max(0, x)`` (not additive either),
        or with ``ring_linear`` charging ``x`` itself (additive, possibly negative);
        memory as priced, ring buffers included. Both are affine in the recomputed
        counts and, for one text sample, a polynomial of degree two in its length."""
        shapes = tuple(shapes)
        counts = self._counts(recompute)
        ring = int(ring_size)
        work = self._work(shapes, sp_size, counts, sp_size // ring, floor=True)
        seconds = float(work.as_array() @ self._rates)
        memory = float(self._memory(shapes, sp_size, counts))
        if ring > 1:
            seconds += self._ring_exposed_s(shapes, sp_size, ring, counts, ring_linear)
            local = sum(s.tokens for s in shapes) / sp_size
            chunk = self._ring_chunk_bytes(shapes, sp_size, ring)
            memory += 4 * chunk + 4 * local * self.spec.hidden
        return seconds, memory

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

    def work(self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]) -> Work:
        """The work the time formula charges for (used by hardware calibration)."""
        return self._work(tuple(shapes), sp_size, self._counts(recompute))

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

    def _work(
        self,
        shapes: tuple[SampleShape, ...],
        sp: int,
        counts: tuple[int, ...],
        ulysses: int | None = None,
        *,
        floor: bool = False,
    ) -> Work:
        """Work of one pass on ``sp`` ranks whose all-to-all runs over ``ulysses`` of
        them (default all: Ulysses only). ``floor``: the work :meth:`pass_floor` prices
        (no GEMM saturation, no serialised scatter; ``shapes`` may be empty)."""
        u = sp if ulysses is None else ulysses
        if not shapes and not floor:
            raise ValueError("a micro-batch needs at least one sample")
        if sp < 1:
            raise ValueError(f"sp_size must be >= 1, got {sp}")
        spec, hw, b = self.spec, self.hardware, self.dtype_bytes
        h = spec.hidden
        sums = self._sums(shapes)
        tokens, n = sums.tokens, sums.n
        local = tokens / sp
        cond = spec.cross_attn_tokens

        cast, grad = weight_traffic_bytes(b)
        trained = spec.weight_grad_share  # frozen weights: no weight-gradient matmul
        grad *= trained
        # token-weighted mean sample length: how long each serialised scatter runs
        serial = 0.0 if floor else sums.squares / tokens / sp
        w = _PassSums()
        self._add_blocks(w, shapes, sp, counts, u, serial=serial, cast=cast, grad=grad, floor=floor)
        # outside the blocks: LM head (forward + 2x backward) or DiT patch in/out and the
        # caption embedder (every rank of the group embeds the whole caption).
        outer = 0.0
        if spec.vocab_size:
            outer += 2.0 * h * spec.vocab_size * local
            w.mem += 3.0 * spec.vocab_size * local * 4  # softmax + loss over fp32 logits
        if spec.patch_channels:
            outer += 2.0 * 2 * spec.patch_channels * h * local
        if cond:
            outer += 2.0 * (spec.cross_attn_width * h + h * h) * cond * n
        w.mm += (2.0 + trained) * outer
        w.mem += spec.outer_params * (cast + grad)
        w.modulation += spec.outer_per_token_modulation * local * 3
        w.scattered += spec.outer_per_token_modulation * serial
        sat = 1.0
        if hw.half_efficiency_tokens and not floor:
            sat = local / (local + hw.half_efficiency_tokens)
        # the per-sample path's slice backward: one full-size q, k, v gradient per segment
        copy = n * local * (h + 2 * spec.kv_dim) * b * spec.num_blocks
        return Work(
            w.mm / sat,
            w.attn,
            w.mem,
            w.nvl,
            w.ib,
            w.colls,
            w.passes,
            attention_backward_flops=w.attn_bwd,
            segment_passes=w.segment_passes,
            segment_copy_bytes=copy,
            scattered_elements=w.scattered,
            modulation_elements=w.modulation,
            recomputed_blocks=sum(counts),
            outer_ops=spec.outer_ops,
        )

    def _add_blocks(
        self,
        w: _PassSums,
        shapes: tuple[SampleShape, ...],
        sp: int,
        counts: tuple[int, ...],
        u: int,
        *,
        serial: float,
        cast: float,
        grad: float,
        floor: bool = False,
    ) -> None:
        """Add the repeated blocks' work to ``w``: per kind, every block's forward (again
        when recomputed) and backward, its all-to-alls over ``u`` ranks and its weight
        traffic (``cast`` and ``grad`` bytes per parameter)."""
        spec, hw, b = self.spec, self.hardware, self.dtype_bytes
        sums = self._sums(shapes)
        h, cond, n = spec.hidden, spec.cross_attn_tokens, sums.n
        tokens = sums.tokens
        local = tokens / sp
        block_matmul = (
            2.0 * spec.token_matmul_params * local
            + 2.0 * spec.cond_matmul_params * cond * n
            + 2.0 * spec.per_sample_block_params * n
        )
        block_mem = 2.0 * self._saved_elems * local * b
        trained = spec.weight_grad_share
        for i, kind in enumerate(self._kinds):
            blocks = self._kind_counts[i]
            fwd_passes = blocks + counts[i]  # forward of every block, again if recomputed
            attn_fwd = 4.0 * h * (sums.pairs[i] + tokens * cond) / sp
            a2a_bytes, a2a_calls = self._alltoall(kind, shapes, u, local, floor=floor)
            w.mm += block_matmul * (fwd_passes + (1 + trained) * blocks)
            w.attn += attn_fwd * fwd_passes
            w.attn_bwd += attn_fwd * ATTENTION_BACKWARD_FACTOR * blocks
            w.mem += block_mem * (fwd_passes + 2 * blocks)
            w.mem += spec.block_params * (cast * fwd_passes + grad * blocks)
            w.segment_passes += n * (fwd_passes + 2 * blocks)
            w.modulation += spec.per_token_modulation * local * (fwd_passes + 2 * blocks)
            w.scattered += spec.per_token_modulation * serial * blocks
            total_a2a = a2a_bytes * (fwd_passes + blocks)
            w.colls += a2a_calls * (fwd_passes + blocks)
            w.passes += fwd_passes + 2 * blocks
            if u > hw.gpus_per_node:
                off = (u - hw.gpus_per_node) / (u - 1)
                w.ib += total_a2a * off
                w.nvl += total_a2a * (1 - off)
            else:
                w.nvl += total_a2a

    def _alltoall(
        self,
        kind: str,
        shapes: tuple[SampleShape, ...],
        sp: int,
        local: float,
        *,
        floor: bool = False,
    ) -> tuple[float, int]:
        """Bytes one rank sends and collective calls in one forward of one block, on an
        all-to-all over ``sp`` ranks (``local`` tokens per rank). ``floor``: the calls
        of the cheapest layout, whatever the samples (calls are shared by a pass)."""
        if sp == 1:
            return 0.0, 0
        spec, b = self.spec, self.dtype_bytes
        share = (sp - 1) / sp
        # q, k, v in (one stacked all-to-all when k and v have all heads, else three),
        # the attention output back
        calls = 2 if spec.kv_dim == spec.hidden else 4
        ulysses = (local * (2 * spec.hidden + 2 * spec.kv_dim) * b * share, calls)
        if spec.sp_layout == "ulysses":
            return ulysses
        frame_sharded = all(s.grid is not None and s.grid[0] % sp == 0 for s in shapes)
        calls = 0 if kind == "spatial" else 2  # frame-sharded
        if not frame_sharded:  # frames cannot be split evenly: fall back to Ulysses
            return ulysses[0], min(calls, ulysses[1]) if floor else ulysses[1]
        if kind == "spatial":
            return 0.0, 0
        return local * spec.hidden * b * share * 2, 2

    def _memory(self, shapes: tuple[SampleShape, ...], sp: int, counts: tuple[int, ...]) -> int:
        spec, b = self.spec, self.dtype_bytes
        h = spec.hidden
        sums = self._sums(shapes)
        local = sums.tokens / sp
        n = sums.n
        saved_block = self._saved_elems * local * b
        input_only = h * local * b
        cond_kv = 2 * h * spec.cross_attn_tokens * n * b
        saved = 0.0
        for i in range(len(self._kinds)):
            recomputed = counts[i]
            kept = self._kind_counts[i] - recomputed
            saved += kept * (saved_block + cond_kv) + recomputed * (input_only + cond_kv)
        # embeddings / caption embedder outputs kept for backward
        saved += 2 * h * local * b + spec.cross_attn_tokens * n * (spec.cross_attn_width + h) * b
        head = self._loss_head_bytes(local)
        grad_work = (2 * h + spec.ffn_hidden) * local * b
        recompute_peak = saved_block - input_only if any(counts) else 0.0
        transient = max(head, recompute_peak + grad_work)
        return int(self.model_state_bytes() + saved + transient)

    def _loss_head_bytes(self, local: float) -> float:
        """Bytes the LM loss head holds at its peak over ``local`` tokens of one rank (0
        without a vocabulary). The models upcast the logits and take ``cross_entropy`` in
        float32: backward's log_softmax holds its saved output, the gradient coming in and
        the gradient it writes, three float32 tokens x vocab tensors (12 bytes a logit);
        forward peaks at the float32 logits, their log_softmax and, while upcasting, the
        model-dtype logits (8 + b). Measured: 12 bytes a logit, fp32 and bf16
        (tests/runtime/models/test_loss_head_memory.py)."""
        return self.spec.vocab_size * local * max(3 * 4, 2 * 4 + self.dtype_bytes)


def analytic_model(
    spec: ModelSpec,
    hardware: Hardware,
    *,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
) -> AnalyticCostModel:
    """The analytic model of ``spec`` on ``hardware``: the one place its settings are read.

    ``dtype_bytes`` defaults to 4 (fp32) on ``cpu-local`` and 2 (bf16) elsewhere.
    ``shard`` on ``world_size`` ranks: how model state is held (a
    :class:`~datacentric.planning.sharding.ShardingSpec` or its mode; default
    :data:`~datacentric.planning.sharding.DEFAULT_SHARD`). ``grad_sync_overlap``: share
    of the gradient reduction hidden behind backward (0: the model reports all of it).
    """
    if dtype_bytes is None:
        dtype_bytes = 4 if hardware.name == "cpu-local" else 2
    sharding = shard if isinstance(shard, ShardingSpec) else ShardingSpec(shard or DEFAULT_SHARD)
    return AnalyticCostModel(
        spec,
        hardware,
        dtype_bytes=dtype_bytes,
        sharding=sharding,
        world_size=world_size,
        grad_sync_overlap=grad_sync_overlap,
    )
