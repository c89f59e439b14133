"""The cost-model interface shared by the planner, the scheduler and the simulator.

A cost model predicts, for one micro-batch (a list of sample shapes processed in
one forward+backward pass) on an SP group of ``sp_size`` ranks with a given
per-block recomputation setting, one :class:`PassBreakdown`: the wall time of the
pass on each rank of the group split into compute, recomputation and the group's
communication, and the peak device memory of each rank. Implementations derive
from :class:`CachedCostModel`, which caches breakdowns and derives ``pass_time_s``
and ``pass_memory_bytes`` from them: the fitted model (profiles measured on the
real device), the analytic model (FLOPs and bytes on a named hardware preset, also
calibrated). :mod:`datacentric.profiling.factory` builds each kind by name (a run's
on its own device: :func:`datacentric.train.build.run_cost_model`). The scheduler and
simulator only use this protocol, so they never depend on where the numbers come from.
A cost model prices memory (``memory_bytes``) and holds no budget: the budget is the
plan's (:mod:`datacentric.planning.memory_cap`).

Two optional attributes refine planning when a model has them (both implementations
here do): ``block_kinds`` (a tuple naming each block's kind; the recomputation knapsack
groups blocks by it, one kind otherwise) and ``supports_sp_size(sp) -> bool`` (Ulysses
needs the SP size to divide the heads; the fitted model predicts only measured sizes).

**Splits.** A group of ``sp`` ranks may run Ulysses over ``u`` ranks inside an attention
ring of ``r`` positions (``sp = u * r``; ``MicroBatch.ring_size`` is ``r``). A model
that prices rings takes ``ring_size=r`` in :meth:`CachedCostModel.breakdown` (and the
methods derived from it) and says which splits it prices with ``supports_split(sp, r)``;
:func:`split_breakdown` asks any cost model, passing ``ring_size`` only when ``r > 1``,
so a model without rings keeps working on Ulysses-only schedules and refuses (with
``ValueError``) a ring it cannot price.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import mul
from typing import Any, Protocol, runtime_checkable

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
    inter_node_backward_s: float = 0.0
    """Seconds the backward's ring traffic holds the inter-node link (a ring across
    nodes): the gradient sync hidden behind that backward shares the link, so it has
    that much less of the backward to hide in."""


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

    #: Whether a pass of text samples (no grid) costs what the samples' number, summed
    #: tokens and summed squared tokens say, to the last bit (integer sums, so in any
    #: order): passes equal in those share one cached answer. The analytic model's
    #: formulas read nothing else of text; a wrapper, or a model summing floats per
    #: sample, keeps the default (keyed by the shapes themselves).
    prices_text_by_sums: bool = False

    def recompute_key(self, recompute: Sequence[bool]) -> Hashable:
        """What of ``recompute`` the cost depends on (default: every flag)."""
        return tuple(bool(r) for r in recompute)

    @abstractmethod
    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        """The breakdown of a pass (uncached); ``key`` is :meth:`recompute_key`'s."""

    def compute_split_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> PassBreakdown:
        """The breakdown of a pass whose group runs a ring of ``ring_size > 1`` positions
        (uncached). This default refuses: the model prices Ulysses only."""
        raise ValueError(
            f"{type(self).__name__} prices Ulysses-only groups; it cannot price a ring of "
            f"{ring_size} on SP {sp_size}"
        )

    def supports_split(self, sp_size: int, ring_size: int) -> bool:
        """Whether the model prices ``sp_size`` ranks split into ``sp_size / ring_size``
        Ulysses ranks times a ring of ``ring_size`` (default: Ulysses only)."""
        if ring_size != 1:
            return False
        supports = getattr(self, "supports_sp_size", None)
        return supports is None or bool(supports(sp_size))

    def breakdown(
        self,
        shapes: Sequence[SampleShape],
        sp_size: int,
        recompute: Sequence[bool],
        *,
        ring_size: int = 1,
    ) -> PassBreakdown:
        """The cached breakdown of one micro-batch pass (on a ring of ``ring_size``)."""
        cache: dict[tuple, PassBreakdown] | None = self.__dict__.get("_breakdowns")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_breakdowns", cache)  # frozen dataclasses too
        shapes = tuple(shapes)
        ring = int(ring_size)
        key = (self._shapes_key(shapes), int(sp_size), self.recompute_key(recompute), ring)
        found = cache.get(key)
        if found is None:
            if ring < 1 or sp_size % ring:
                raise ValueError(f"ring size {ring} does not divide SP size {sp_size}")
            if len(cache) >= BREAKDOWN_CACHE_SIZE:
                cache.clear()
            if ring == 1:
                found = self.compute_breakdown(shapes, int(sp_size), key[2])
            else:
                found = self.compute_split_breakdown(shapes, int(sp_size), ring, key[2])
            cache[key] = found
        return found

    def pass_time_s(
        self,
        shapes: Sequence[SampleShape],
        sp_size: int,
        recompute: Sequence[bool],
        *,
        ring_size: int = 1,
    ) -> float:
        """Forward + backward seconds of one micro-batch (see :class:`PassBreakdown`)."""
        return self.breakdown(shapes, sp_size, recompute, ring_size=ring_size).time_s

    def compute_memory_bytes(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> int | None:
        """Peak bytes of a Ulysses-only pass without its time (uncached), or ``None`` when
        the model has nothing cheaper than :meth:`compute_breakdown` (the default). A
        model that answers must answer exactly its breakdown's ``memory_bytes``."""
        return None

    def compute_split_memory_bytes(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> int | None:
        """:meth:`compute_memory_bytes` of a pass on a ring of ``ring_size > 1`` (default
        ``None``: ask the breakdown). A model that answers must answer exactly its
        breakdown's ``memory_bytes``, and refuse (``ValueError``) a split it cannot price."""
        return None

    def pass_memory_bytes(
        self,
        shapes: Sequence[SampleShape],
        sp_size: int,
        recompute: Sequence[bool],
        *,
        ring_size: int = 1,
    ) -> int:
        """Peak bytes on one rank of the group. Memory checks ask for many micro-batches
        whose time is never needed, so a model's :meth:`compute_memory_bytes` (on a ring,
        :meth:`compute_split_memory_bytes`) answers them without the time (cached apart);
        else the breakdown's."""
        ring = int(ring_size)
        cache: dict[tuple, int] | None = self.__dict__.get("_memories")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_memories", cache)  # frozen dataclasses too
        shapes = tuple(shapes)
        key = (self._shapes_key(shapes), int(sp_size), self.recompute_key(recompute), ring)
        found = cache.get(key)
        if found is None:
            if ring == 1:
                found = self.compute_memory_bytes(shapes, key[1], key[2])
            elif ring < 1 or sp_size % ring:
                raise ValueError(f"ring size {ring} does not divide SP size {sp_size}")
            else:
                found = self.compute_split_memory_bytes(shapes, key[1], ring, key[2])
            if found is None:
                found = self.breakdown(shapes, sp_size, recompute, ring_size=ring).memory_bytes
            if len(cache) >= BREAKDOWN_CACHE_SIZE:
                cache.clear()
            cache[key] = found
        return found

    def _shapes_key(self, shapes: tuple[SampleShape, ...]) -> tuple:
        """The cache key of a micro-batch's shapes: with :attr:`prices_text_by_sums`,
        text samples' :func:`text_sums` (hashing a few ints, not every shape); else
        :func:`_shapes_key`'s."""
        if self.prices_text_by_sums:
            sums = text_sums(shapes)
            if sums is not None:
                # kept for the model's formulas, which read these sums of the same tuple
                object.__setattr__(self, "_last_text_sums", (shapes, sums))
                return sums
        return _shapes_key(shapes)


class WrappedCostModel(CachedCostModel):
    """A cost model that answers as the one it wraps (``inner``) except for what a
    subclass prices itself: every other attribute (``block_kinds``,
    ``supports_sp_size``, ``max_ring_size``, ...) is the wrapped model's.

    Except the floor (``pass_floor``, which the proved bound reads): a wrapper that
    changes a pass's time or memory must define its own, or it offers none (the bound
    then falls back to the priced one); only a wrapper whose :attr:`same_prices` says
    it prices every pass it runs as the wrapped model does inherits the wrapped one."""

    #: Whether every pass this wrapper prices costs what the wrapped model says (it
    #: only limits which passes run), so the wrapped model's ``pass_floor`` holds.
    same_prices: bool = False

    def __init__(self, cost_model: CostModel) -> None:
        self.inner = cost_model

    def __getattr__(self, name: str) -> Any:
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        if name == "pass_floor" and not self.same_prices:
            raise AttributeError(
                f"{type(self).__name__} changes the wrapped model's prices and defines no "
                "pass_floor of its own"
            )
        return getattr(self.inner, name)

    @property
    def num_blocks(self) -> int:
        return self.inner.num_blocks

    @property
    def gpus_per_node(self) -> int:
        return self.inner.gpus_per_node

    def grad_sync_time_s(self, world_size: int) -> float:
        """The wrapped model's gradient synchronisation."""
        return self.inner.grad_sync_time_s(world_size)  # type: ignore[attr-defined]


def _shapes_key(shapes: tuple[SampleShape, ...]) -> tuple:
    """The cache key of a micro-batch's shapes: copies of one shape object (the
    planner's and the bound's searches ask for thousands) keyed by the shape and their
    number, so the key is not hashed element by element; any other tuple as it is (a
    tuple of shapes never starts with a string). Copies are counted in C (``count``
    compares by identity first; an equal shape elsewhere is the same key by value)."""
    if len(shapes) > 4:
        first = shapes[0]
        if shapes[-1] is first and shapes.count(first) == len(shapes):
            return ("copies", first, len(shapes))
    return shapes


def text_sums(shapes: Sequence[SampleShape]) -> tuple | None:
    """``("text", samples, summed tokens, summed squared tokens)`` of text ``shapes``
    (None if one is video): what a model with ``prices_text_by_sums`` prices them by."""
    first = shapes[0] if shapes else None
    if first is not None and len(shapes) > 4 and shapes[-1] is first:
        if shapes.count(first) == len(shapes):  # copies of one shape (counted in C)
            if first.grid is not None:
                return None
            n, t = len(shapes), first.tokens
            return ("text", n, n * t, n * t * t)
    lengths = []
    for s in shapes:
        if s.grid is not None:
            return None
        lengths.append(s.tokens)
    return lengths_sums(lengths)


def lengths_sums(lengths: Sequence[int]) -> tuple:
    """:func:`text_sums` of text samples of ``lengths`` tokens."""
    return ("text", len(lengths), sum(lengths), sum(map(mul, lengths, lengths)))


def split_breakdown(
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    sp_size: int,
    recompute: Sequence[bool],
    ring_size: int = 1,
) -> PassBreakdown:
    """``cost_model.breakdown`` of a pass on ``sp_size`` ranks with a ring of
    ``ring_size`` (``ring_size`` is passed only when above 1, so cost models without
    rings answer Ulysses-only passes as before)."""
    if ring_size == 1:
        return cost_model.breakdown(shapes, sp_size, recompute)
    return cost_model.breakdown(shapes, sp_size, recompute, ring_size=ring_size)  # type: ignore[call-arg]


def split_memory_bytes(
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    sp_size: int,
    recompute: Sequence[bool],
    ring_size: int = 1,
) -> int:
    """``memory_bytes`` of :func:`split_breakdown`'s pass, asked without the time formula
    where the model answers so (``pass_memory_bytes``, on a ring too for a
    :class:`CachedCostModel`)."""
    if ring_size == 1:
        return int(cost_model.pass_memory_bytes(shapes, sp_size, recompute))
    if isinstance(cost_model, CachedCostModel):
        return int(cost_model.pass_memory_bytes(shapes, sp_size, recompute, ring_size=ring_size))
    return int(split_breakdown(cost_model, shapes, sp_size, recompute, ring_size).memory_bytes)


def supports_split(cost_model: CostModel, sp_size: int, ring_size: int) -> bool:
    """Whether ``cost_model`` prices ``sp_size`` ranks with a ring of ``ring_size``: its
    ``supports_split`` when it has one; else Ulysses only (``supports_sp_size``)."""
    own = getattr(cost_model, "supports_split", None)
    if own is not None:
        return bool(own(sp_size, ring_size))
    if ring_size != 1:
        return False
    supports = getattr(cost_model, "supports_sp_size", None)
    return supports is None or bool(supports(sp_size))
