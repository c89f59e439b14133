"""The planner: per bucket, the SP size, micro-batch size and recomputation to run it with.

For each bucket (planned through its largest member shape) the planner searches

- SP sizes: divisors of the world the cost model runs with some split into Ulysses x
  ring (:func:`~datacentric.planning.bucket_options.split_candidates`; past the head
  count only with a ring), those within a node first; groups larger than a node are
  tried only when nothing fits inside one;
- micro-batch sizes: 1, 2, 3, 4, 6, 8, 12, ... (:func:`batch_ladder`) until the
  predicted memory with *full* recomputation exceeds the cap (or
  ``max_micro_batch_size``, the ``[scheduling]`` bound);
- recomputation: Pyramid Activation Checkpointing (PAC). With every block
  recomputing, the pass fits with some spare memory; a knapsack chooses which blocks
  keep their activations instead (value: the recomputation time saved; cost: the extra
  activation bytes; capacity: the spare bytes). Blocks of one kind cost and save the
  same, so the knapsack is over *counts per block kind*, solved exactly by a Pareto
  frontier over (bytes, seconds) with bytes as exact integers (no rounding to GB).

and keeps the setting with the most samples per GPU-second, ``bs / (sp * time)``, whose
recomputation (and each SP size's own) joins the bucket's options.

Each bucket's plan also carries its **options** (:func:`bucket_options`), every way
the scheduler's policies may run it: at every SP size above, with no recomputation,
with every block recomputing, and with the knapsack's choices (the best plan's, and each
size's own), each on its cheapest split into Ulysses x ring, the largest
micro-batch that fits (exact, up to ``max_micro_batch_size``) and the time curve.
Policies choose among these and search nothing themselves. Everything is a pure
function of the buckets and the cost model.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datacentric.planning.bucket_options import (
    BucketOption,
    evaluate_option,
    sp_size_tiers,
    split_candidates,
)
from datacentric.planning.cost_model import CostModel, split_breakdown, split_memory_bytes
from datacentric.planning.hardware import gib_text
from datacentric.planning.plan import BucketPlan, Plan
from datacentric.settings.scheduling import MAX_MICRO_BATCH_SIZE
from datacentric.shapes import Bucket, Bucketing, SampleShape


class UnfittableBucketError(ValueError):
    """A bucket fits no configuration even at the largest SP size with full recomputation."""

    def __init__(self, bucket: str, needed_bytes: int, cap_bytes: int, sp_size: int) -> None:
        self.bucket = bucket
        self.needed_bytes = needed_bytes
        self.cap_bytes = cap_bytes
        self.sp_size = sp_size
        super().__init__(
            f"bucket {bucket!r} does not fit: one sample needs {needed_bytes} bytes "
            f"({gib_text(needed_bytes)} GiB) per rank even with SP size {sp_size} and every "
            f"block recomputing, above the memory cap of {cap_bytes} bytes "
            f"({gib_text(cap_bytes)} GiB); raise the cap or use more ranks (or leave the "
            "bucket out: skip_unfittable, the planning commands' --skip-unfittable)"
        )


@dataclass(frozen=True)
class KnapsackResult:
    """Chosen count per group, total value and total cost."""

    counts: tuple[int, ...]
    value: float
    cost: int


def knapsack_counts(
    values: Sequence[float], costs: Sequence[int], limits: Sequence[int], capacity: int
) -> KnapsackResult:
    """Bounded knapsack over groups of identical items, solved exactly.

    Group ``g`` has ``limits[g]`` items, each worth ``values[g]`` and costing
    ``costs[g]`` (integer bytes). Returns counts maximising the total value with total
    cost at most ``capacity``. Keeps the Pareto frontier of (cost, value) over the
    groups seen so far, so it is exact for any integer costs; its size is bounded by
    the product of ``limits[g] + 1`` (a few thousand for the models here).
    """
    if not len(values) == len(costs) == len(limits):
        raise ValueError("values, costs and limits must have one entry per group")
    frontier: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
    for value, cost, limit in zip(values, costs, limits):
        cost = int(cost)
        grown = [
            (c + k * cost, v + k * value, counts + (k,))
            for c, v, counts in frontier
            for k in range(limit + 1)
            if c + k * cost <= capacity
        ]
        frontier = _pareto(grown)
    best = max(frontier, key=lambda item: (item[1], -item[0]))
    return KnapsackResult(counts=best[2], value=best[1], cost=best[0])


def _pareto(
    items: list[tuple[int, float, tuple[int, ...]]],
) -> list[tuple[int, float, tuple[int, ...]]]:
    """Items not dominated (less or equal cost and more value) by another."""
    items.sort(key=lambda item: (item[0], -item[1]))
    kept: list[tuple[int, float, tuple[int, ...]]] = []
    for item in items:
        if not kept or item[1] > kept[-1][1]:
            kept.append(item)
    return kept


def block_kinds_of(cost_model: CostModel) -> tuple[str, ...]:
    """Kind of every block: the cost model's ``block_kinds`` when it has one, else one kind."""
    kinds = getattr(cost_model, "block_kinds", None)
    if kinds is None:
        return ("block",) * cost_model.num_blocks
    return tuple(kinds)


def recompute_from_counts(
    block_kinds: Sequence[str], kept_per_kind: Mapping[str, int]
) -> tuple[bool, ...]:
    """Per-block recompute flags where the *last* ``kept_per_kind[k]`` blocks of each kind
    keep their activations (backward reaches them first, so they are freed first)."""
    remaining = dict(kept_per_kind)
    flags = [True] * len(block_kinds)
    for i in range(len(block_kinds) - 1, -1, -1):
        kind = block_kinds[i]
        if remaining.get(kind, 0) > 0:
            flags[i] = False
            remaining[kind] -= 1
    return tuple(flags)


@dataclass(frozen=True)
class RecomputeChoice:
    """A recomputation setting with its predicted time and peak memory."""

    recompute: tuple[bool, ...]
    time_s: float
    memory_bytes: int


def choose_recompute(
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    sp_size: int,
    cap_bytes: int,
    ring_size: int = 1,
) -> RecomputeChoice | None:
    """The fastest recomputation setting of one micro-batch under ``cap_bytes`` (PAC),
    on ``sp_size`` ranks with a ring of ``ring_size``.

    ``None`` when even full recomputation does not fit. The knapsack uses each kind's
    marginal value and cost measured on the cost model (one block of that kind stops
    recomputing); the chosen setting is then checked against the cost model itself and
    the capacity tightened if a non-additive term (a transient peak) overshoots.
    """
    kinds = block_kinds_of(cost_model)

    def memory(flags: tuple[bool, ...]) -> int:
        return split_memory_bytes(cost_model, shapes, sp_size, flags, ring_size)

    def time(flags: tuple[bool, ...]) -> float:
        if ring_size == 1:
            return float(cost_model.pass_time_s(shapes, sp_size, flags))
        return float(split_breakdown(cost_model, shapes, sp_size, flags, ring_size).time_s)

    none = (False,) * len(kinds)
    mem_none = memory(none)
    if mem_none <= cap_bytes:  # everything fits: recompute nothing
        return RecomputeChoice(none, time(none), mem_none)
    full = (True,) * len(kinds)
    mem_full = memory(full)
    if mem_full > cap_bytes:
        return None
    time_full = time(full)
    distinct = tuple(dict.fromkeys(kinds))
    limits = [kinds.count(k) for k in distinct]
    values, costs = [], []
    for kind in distinct:
        one_kept = recompute_from_counts(kinds, {kind: 1})
        values.append(time_full - time(one_kept))
        costs.append(memory(one_kept) - mem_full)
    capacity = cap_bytes - mem_full
    best = RecomputeChoice(full, time_full, mem_full)
    for _ in range(8):  # tighten the capacity if the additive estimate overshoots
        result = knapsack_counts(values, costs, limits, capacity)
        flags = recompute_from_counts(kinds, dict(zip(distinct, result.counts)))
        used = memory(flags)
        if used <= cap_bytes:
            seconds = time(flags)
            return RecomputeChoice(flags, seconds, used) if seconds <= best.time_s else best
        capacity -= used - cap_bytes
        if capacity < 0:
            break
    return best


def batch_ladder(limit: int) -> list[int]:
    """The micro-batch sizes the knapsack search tries, up to ``limit``: powers of two
    and one and a half times them (1, 2, 3, 4, 6, 8, 12, ...). Between two powers the
    cheapest recomputation depth can differ: three 3,800-token documents recomputing one
    block of llama-7b cost 2.2% fewer GPU-seconds each on one H200 than two recomputing
    none, the best of the powers of two."""
    sizes, power = [], 1
    while power <= limit:
        sizes += [power] + ([power * 3 // 2] if power > 1 and power * 3 // 2 <= limit else [])
        power *= 2
    return sizes


def plan_bucket(
    bucket: Bucket,
    cost_model: CostModel,
    *,
    world_size: int,
    memory_cap_bytes: int | None = None,
    sp_sizes: Sequence[int] | None = None,
    max_micro_batch_size: int = MAX_MICRO_BATCH_SIZE,
    knapsack_option: bool = True,
) -> BucketPlan:
    """The options of one bucket (:func:`bucket_options`, up to ``max_micro_batch_size``
    samples per micro-batch), the knapsack's recomputation among them if
    ``knapsack_option``: the best (sp, micro-batch up to ``max_micro_batch_size``,
    recompute) of the search below, and each SP size's own. Raises
    :class:`UnfittableBucketError` when nothing fits."""
    cap = plan_budget(cost_model, memory_cap_bytes, "plan_bucket")
    within, across = sp_size_tiers(cost_model, world_size, sp_sizes)
    if not within and not across:
        raise ValueError(f"no usable SP size for world size {world_size} (sp_sizes={sp_sizes})")
    for tier in (within, across):
        best: _Candidate | None = None
        knapsack: dict[int, tuple[bool, ...]] = {}  # per SP size: its best plan's choice
        for sp in tier:
            best_here: _Candidate | None = None
            ring = split_candidates(cost_model, sp)[0]
            for bs in batch_ladder(max_micro_batch_size):
                shapes = [bucket.shape] * bs
                choice = choose_recompute(cost_model, shapes, sp, cap, ring)
                if choice is None:
                    break
                candidate = _Candidate(sp, bs, choice)
                if best_here is None or _better(candidate, best_here):
                    best_here = candidate
            if best_here is not None:
                knapsack[sp] = best_here.choice.recompute
                if best is None or _better(best_here, best):
                    best = best_here
        if best is not None:
            options = bucket_options(
                bucket.shape,
                cost_model,
                sizes=within + across,
                recomputes=(best.choice.recompute,) if knapsack_option else (),
                per_size=knapsack if knapsack_option else None,
                memory_cap_bytes=cap,
                max_micro_batch_size=max_micro_batch_size,
            )
            return BucketPlan(bucket.name, bucket.shape, options)
    largest = (within + across)[-1]
    full = (True,) * cost_model.num_blocks
    ring = split_candidates(cost_model, largest)[0]
    needed = split_memory_bytes(cost_model, [bucket.shape], largest, full, ring)
    raise UnfittableBucketError(bucket.name, needed, cap, largest)


def bucket_options(
    shape: SampleShape,
    cost_model: CostModel,
    *,
    sizes: Sequence[int],
    recomputes: Sequence[tuple[bool, ...]] = (),
    per_size: Mapping[int, tuple[bool, ...]] | None = None,
    memory_cap_bytes: int,
    max_micro_batch_size: int = MAX_MICRO_BATCH_SIZE,
) -> tuple[BucketOption, ...]:
    """Every feasible option of a bucket whose representative is ``shape``: on each
    of ``sizes`` (each on its cheapest split), with no recomputation, every block
    recomputing and each of ``recomputes`` (the knapsack's choice), plus on a size of
    ``per_size`` the knapsack's choice there (a long sample recomputes every block on
    one GPU but has memory to spare on eight), ordered by SP size then recomputation."""
    blocks = cost_model.num_blocks
    settings = [(False,) * blocks, (True,) * blocks]
    settings += [tuple(rc) for rc in recomputes if len(rc) == blocks]
    per_size = per_size or {}
    guesses: dict[tuple[bool, ...], int] = {}
    options = []
    for sp in sizes:
        own = [tuple(per_size[sp])] if sp in per_size and len(per_size[sp]) == blocks else []
        for rc in dict.fromkeys(settings + own):
            option = evaluate_option(
                cost_model,
                shape,
                sp,
                rc,
                memory_cap_bytes,
                max_micro_batch_size,
                guess=guesses.get(rc, 1),
                ring=None,
            )
            if option is not None:
                guesses[rc] = option.max_batch
                options.append(option)
    return tuple(options)


def plan_budget(cost_model: CostModel, memory_cap_bytes: int | None, caller: str) -> int:
    """The budget a plan is made under: ``memory_cap_bytes``; without one, the
    deprecated cap of a cost model that still holds one (with a warning)."""
    if memory_cap_bytes is not None:
        if memory_cap_bytes <= 0:
            raise ValueError(f"memory_cap_bytes must be > 0, got {memory_cap_bytes}")
        return int(memory_cap_bytes)
    warnings.warn(
        f"{caller} without memory_cap_bytes is deprecated: resolve the budget once "
        "(resolve_memory_cap) and pass it",
        DeprecationWarning,
        stacklevel=3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        legacy = getattr(cost_model, "memory_capacity_bytes", None)
    if legacy is None:
        raise TypeError(f"{caller} needs memory_cap_bytes (cost models hold no budget)")
    return int(legacy)


@dataclass(frozen=True)
class _Candidate:
    """A setting the search tries: ``bs`` samples on ``sp`` ranks with its PAC choice."""

    sp: int
    bs: int
    choice: RecomputeChoice

    @property
    def rate(self) -> float:
        if self.choice.time_s <= 0:
            return float("inf")
        return self.bs / (self.sp * self.choice.time_s)


def _better(a: _Candidate, b: _Candidate) -> bool:
    """More samples per GPU-second; ties go to less memory, then smaller groups."""
    ra, rb = a.rate, b.rate
    if abs(ra - rb) > 1e-12 * max(ra, rb):
        return ra > rb
    return (a.choice.memory_bytes, a.sp) < (b.choice.memory_bytes, b.sp)


def plan_buckets(
    buckets: Sequence[Bucket] | Bucketing,
    cost_model: CostModel,
    *,
    world_size: int,
    memory_cap_bytes: int | None = None,
    sp_sizes: Sequence[int] | None = None,
    skip_unfittable: bool = False,
    sample_counts: Mapping[str, int] | None = None,
    max_micro_batch_size: int = MAX_MICRO_BATCH_SIZE,
    knapsack_option: bool = True,
) -> Plan:
    """Plan every bucket (see the module doc).

    ``buckets`` may be a :class:`~datacentric.shapes.Bucketing`, whose member counts
    then give the skipped sample counts; otherwise pass ``sample_counts`` (bucket name
    to samples) for them. An unfittable bucket raises :class:`UnfittableBucketError`
    unless ``skip_unfittable``, in which case it is left out of the plan and its sample
    count recorded in ``Plan.skipped``. ``memory_cap_bytes`` is the budget per rank,
    resolved by the caller (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`);
    every bucket's options are searched up to ``max_micro_batch_size``
    samples per micro-batch, and include the knapsack's recomputation choice when
    ``knapsack_option`` (else only none and every block).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if max_micro_batch_size < 1:
        raise ValueError(f"max_micro_batch_size must be >= 1, got {max_micro_batch_size}")
    counts: dict[str, int] = dict(sample_counts or {})
    if isinstance(buckets, Bucketing):
        counts = {b.name: len(m) for b, m in zip(buckets.buckets, buckets.members())}
        buckets = buckets.buckets
    cap = plan_budget(cost_model, memory_cap_bytes, "plan_buckets")
    plans: dict[str, BucketPlan] = {}
    skipped: dict[str, int] = {}
    for bucket in buckets:
        try:
            plans[bucket.name] = plan_bucket(
                bucket,
                cost_model,
                world_size=world_size,
                memory_cap_bytes=cap,
                sp_sizes=sp_sizes,
                max_micro_batch_size=max_micro_batch_size,
                knapsack_option=knapsack_option,
            )
        except UnfittableBucketError:
            if not skip_unfittable:
                raise
            skipped[bucket.name] = counts.get(bucket.name, 0)
    return Plan(
        buckets=plans,
        memory_cap_bytes=cap,
        world_size=world_size,
        num_blocks=cost_model.num_blocks,
        skipped=skipped,
        option_batch_limit=max_micro_batch_size,
    )
