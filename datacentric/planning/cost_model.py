"""The cost-model interface shared by the planner, the scheduler and the simulator.

A cost model predicts, for one micro-batch (a list of sample shapes processed in
one forward+backward pass) on an SP group of ``sp_size`` ranks with a given
per-block recomputation setting, one :class:`PassBreakdown`: the wall time of the
pass on each rank of the group split into compute, recomputation and the group's
communication, and the peak device memory of each rank. Implementations derive
from :class:`CachedCostModel`, which caches breakdowns and derives ``pass_time_s``
and ``pass_memory_bytes`` from them: the fitted model (profiles measured on the
real device), the analytic model (FLOPs and bytes on a named hardware preset, also
calibrated). :func:`datacentric.profiling.factory.build_cost_model` builds every
kind. The scheduler and simulator only use this protocol, so they never depend on
where the numbers come from. A cost model prices memory (``memory_bytes``) and holds
no budget: the budget is the plan's (:mod:`datacentric.planning.memory_cap`).

Two optional attributes refine planning when a model has them (both implementations
here do): ``block_kinds`` (a tuple naming each block's kind; the recomputation knapsack
groups blocks by it, one kind otherwise) and ``supports_sp_size(sp) -> bool`` (Ulysses
needs the SP size to divide the heads; the fitted model predicts only measured sizes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from datacentric.shapes import SampleShape

#: Breakdowns one model keeps before its cache is emptied.
BREAKDOWN_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class PassBreakdown:
    """Modelled cost of one micro-batch pass on one rank of its group.

    ``time_s`` is the whole pass and equals ``compute_s + recompute_s + comm_s`` (up
    to rounding): the model's own total, so that planning and simulation agree on it.
    """

    time_s: float
    """Wall time of forward + backward, recomputation and communication included."""
    compute_s: float
    """Forward and backward of every block and of the layers around them."""
    recompute_s: float
    """Second forward of the recomputed blocks (their communication included)."""
    comm_s: float
    """The group's all-to-all of the pass without recomputation (0 when the model
    cannot tell it apart from compute)."""
    memory_bytes: int
    """Peak bytes on one rank: model states plus activations."""


@runtime_checkable
class CostModel(Protocol):
    """Predicts time and memory of one micro-batch pass."""

    @property
    def num_blocks(self) -> int:
        """Number of repeated transformer blocks (length of a recompute tuple)."""
        ...

    @property
    def gpus_per_node(self) -> int:
        """Ranks per node; groups larger than this cross the inter-node network."""
        ...

    def breakdown(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> PassBreakdown:
        """Time split and peak memory of one micro-batch on a group of ``sp_size``."""
        ...

    def pass_time_s(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> float:
        """Forward + backward seconds of one micro-batch: ``breakdown(...).time_s``."""
        ...

    def pass_memory_bytes(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> int:
        """Peak bytes on one rank of the group: ``breakdown(...).memory_bytes``."""
        ...

    def grad_sync_time_s(self, world_size: int) -> float:
        """Seconds of the once-per-iteration gradient all-reduce over the world
        that is *not* hidden behind backward."""
        ...


class CachedCostModel(ABC):
    """Base of every cost model: one cached :meth:`breakdown` per (shapes, SP size,
    recomputation key), from which ``pass_time_s`` and ``pass_memory_bytes`` derive.

    Subclasses implement :meth:`compute_breakdown` and may override
    :meth:`recompute_key` (for instance to the number of recomputed blocks of each
    kind, when only that matters), so that equivalent settings share one entry.
    """

    def recompute_key(self, recompute: Sequence[bool]) -> Hashable:
        """What of ``recompute`` the cost depends on (default: every flag)."""
        return tuple(bool(r) for r in recompute)

    @abstractmethod
    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        """The breakdown of a pass (uncached); ``key`` is :meth:`recompute_key`'s."""

    def breakdown(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> PassBreakdown:
        """The cached breakdown of one micro-batch pass."""
        cache: dict[tuple, PassBreakdown] | None = self.__dict__.get("_breakdowns")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_breakdowns", cache)  # frozen dataclasses too
        shapes = tuple(shapes)
        key = (shapes, int(sp_size), self.recompute_key(recompute))
        found = cache.get(key)
        if found is None:
            if len(cache) >= BREAKDOWN_CACHE_SIZE:
                cache.clear()
            found = cache[key] = self.compute_breakdown(shapes, int(sp_size), key[2])
        return found

    def pass_time_s(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> float:
        """Forward + backward seconds of one micro-batch (see :class:`PassBreakdown`)."""
        return self.breakdown(shapes, sp_size, recompute).time_s

    def pass_memory_bytes(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> int:
        """Peak bytes on one rank of the group."""
        return self.breakdown(shapes, sp_size, recompute).memory_bytes
