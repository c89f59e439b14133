"""How the analytic cost model (:class:`~datacentric.planning.analytic.AnalyticCostModel`)
prices a pass whose sequence-parallel group runs a ring: which splits it prices
(:data:`RING_KINDS`), the ring's exposed transfer and its buffers. :class:`RingPricing` is
a base of the cost model: its methods read the model's settings through ``self``.

*Hybrid groups* (a ring of ``r`` positions over Ulysses groups of ``u = sp / r``;
:meth:`RingPricing.compute_split_breakdown`, text blocks only): the all-to-all of
:mod:`~datacentric.planning.analytic`'s formulas runs over ``u`` ranks (NVLink when
``u <= gpus_per_node``, else the share ``(u - gpn)/(u - 1)`` over InfiniBand), moving
``(u-1)/u`` of the local tensors;
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
"""

from __future__ import annotations

from collections.abc import Hashable

from datacentric.planning.analytic_formulas import ATTENTION_BACKWARD_FACTOR
from datacentric.planning.cost_model import PassBreakdown
from datacentric.planning.hardware import Hardware
from datacentric.planning.heads import kv_head_repeat
from datacentric.planning.model_specs import ModelSpec
from datacentric.shapes import SampleShape

#: Indices of :meth:`Work.as_array` the ring's overlap reads.
_ATTN_FWD, _NVLINK, _IB, _CALL, _ATTN_BWD = 1, 3, 4, 5, 7
#: Block kinds a ring can run (text attention over packed documents).
RING_KINDS = frozenset({"causal", "full"})


class RingPricing:
    """The ring's part of the analytic cost model (a base of
    :class:`~datacentric.planning.analytic.AnalyticCostModel`)."""

    spec: ModelSpec
    hardware: Hardware
    dtype_bytes: int

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
