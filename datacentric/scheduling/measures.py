"""How good a schedule is: per-iteration idle share and efficiency against the ideal.

The **ideal bound** (one function, reused by the simulator): every sample runs at the
fewest GPU-seconds any configuration that fits gives it at its own length (not its
bucket's representative): every SP size a step may use, split, recomputation and
micro-batch size searched by :func:`~datacentric.planning.sample_price.sample_price`,
text members priced per length class at the class's shortest member, so it is never
above what a valid schedule spends; the sum over samples divided by the world size
is the epoch time of a perfectly balanced, communication-free world. A schedule's
**efficiency** is that bound over its estimated epoch time (iterations' makespans plus
the exposed gradient sync).

The **gradient sync** is charged by one rule, :func:`exposed_grad_sync_s`, which the
simulator applies too: where the run's sharding reduces gradients inside the last
backward (DDP, FSDP2: :func:`overlaps_grad_sync`), only the part of the whole
reduction longer than the backward of the last micro-batch of the group that
finishes last is exposed; otherwise all of it.

The **per-step bound** of a step (:func:`step_bound_s`) is the larger of its
samples' ideal GPU-seconds over the world and its longest sample's fastest single
run on any SP size (a sample cannot be split over steps or groups); their sum over
the steps is never below the ideal bound, and no schedule of those steps beats it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from datacentric.planning.cost_model import CostModel, PassBreakdown, split_breakdown
from datacentric.planning.plan import Plan
from datacentric.planning.proved_price import has_floor, proved_prices
from datacentric.planning.sample_price import fastest_run, length_classes, sample_price
from datacentric.schedule import Iteration, Schedule, phase_timeline
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import any_recompute
from datacentric.shapes import SampleShape


def ideal_epoch_time(
    shapes: Sequence[SampleShape],
    cost_model: CostModel,
    world_size: int,
    *,
    plan: Plan,
    max_sp_size: int | None = None,
    sample_ids: Sequence[int] | None = None,
    old_bound: bool = False,
    searched: Callable[[float, float], None] | None = None,
) -> float:
    """The ideal epoch time in seconds of ``shapes`` (or the subset ``sample_ids``) on
    ``world_size`` ranks (see the module doc), over ``plan``'s options; ``old_bound``:
    the former, priced bound instead (:func:`old_gpu_seconds`, what
    ``efficiency_old_bound`` is against; ``searched`` hears its count)."""
    view = DatasetView(shapes)
    table = OptionTable(
        view,
        cost_model,
        plan,
        world_size=world_size,
        max_sp_size=max_sp_size,
        allowed=any_recompute,
    )
    ids = np.arange(view.num_samples) if sample_ids is None else np.asarray(sample_ids)
    if old_bound:
        return float(old_gpu_seconds(table, ids, searched).sum()) / world_size
    return ideal_gpu_seconds(table, ids) / world_size


def ideal_gpu_seconds(table: OptionTable, ids: np.ndarray) -> float:
    """Sum over samples ``ids`` of their cheapest GPU-seconds (see module doc)."""
    return float(sample_gpu_seconds(table, ids).sum())


def sample_gpu_seconds(
    table: OptionTable,
    ids: np.ndarray,
    sizes: list[int] | None = None,
    recompute: str | None = None,
) -> np.ndarray:
    """Per sample of ``ids`` (in that order), its proved price in GPU-seconds
    (:func:`~datacentric.planning.proved_price.proved_prices`: fixed costs shared by
    every sample of a pass, every micro-batch size, mix, split and recomputation
    count), never more than any valid schedule spends on it; for a cost model
    without a floor, :func:`old_gpu_seconds`. ``sizes`` and ``recompute`` restrict
    the passes priced (a policy that runs only those; default: every size a step
    may use, every recomputation count; the restricted price needs the floor)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not has_floor(table.cost_model):
        return old_gpu_seconds(table, ids)
    view = table.view
    sizes = bound_sizes(table) if sizes is None else list(sizes)
    out = np.zeros(len(ids))
    buckets = view.bucket_of[ids]
    groups = []
    for b in np.unique(buckets).tolist():
        rows = np.flatnonzero(buckets == b)
        if view.uniform[b] or view.buckets[b].shape.grid is not None:
            keys = [view.shapes[int(i)] for i in ids[rows]]
            distinct = list(dict.fromkeys(keys))
            index = {k: j for j, k in enumerate(distinct)}
            groups.append((rows, distinct, np.array([index[k] for k in keys], dtype=np.int64)))
        else:
            lengths, inverse = np.unique(view.tokens[ids[rows]], return_inverse=True)
            distinct = [SampleShape.text(int(n)) for n in lengths]
            groups.append((rows, distinct, inverse.reshape(-1)))
    wanted = list(dict.fromkeys(s for _, distinct, _ in groups for s in distinct))
    key = _proved(table, wanted, sizes, recompute)
    for rows, distinct, inverse in groups:
        prices = np.array([table.prices[(s, *key)] for s in distinct])
        out[rows] = prices[inverse]
    return _priced_past(
        table,
        sizes,
        out,
        lambda rows, wider: sample_gpu_seconds(table, ids[rows], wider, recompute),
    )


def _priced_past(table: OptionTable, sizes: list[int], prices: np.ndarray, price) -> np.ndarray:
    """``prices`` with each infinite entry (a sample that fits nothing on ``sizes``,
    e.g. up to ``--max-sp-size``) priced by ``price(rows, wider)`` on every size a step
    may use: the policies put such a sample on a larger group (docs/scheduling.md,
    "Steps too small for the world"), so the bound prices it on the groups it may get,
    never infinite where some group runs it."""
    wider = list(table.all_sizes)
    rows = np.flatnonzero(~np.isfinite(prices))
    if len(rows) == 0 or set(wider) <= set(sizes):
        return prices
    prices = prices.copy()
    prices[rows] = price(rows, wider)
    return prices


def _proved(
    table: OptionTable, shapes: list[SampleShape], sizes: list[int], recompute: str | None
) -> tuple:
    """Price the ``shapes`` not yet priced on ``table`` (one vectorised search); the
    key of their prices in ``table.prices`` after the shape."""
    key = ("proved", tuple(sizes)) + (() if recompute is None else (recompute,))
    missing = [s for s in shapes if (s, *key) not in table.prices]
    if missing:
        prices = proved_prices(table.cost_model, missing, sizes, table.cap, recompute)
        assert prices is not None  # has_floor was checked
        for shape, price in zip(missing, prices.tolist()):
            table.prices[(shape, *key)] = price
    return key


def old_gpu_seconds(
    table: OptionTable,
    ids: np.ndarray,
    searched: Callable[[float, float], None] | None = None,
) -> np.ndarray:
    """Per sample of ``ids`` (in that order), the former bound's price (reported as
    ``efficiency_old_bound``): the price of its length class (video: of its shape)
    over every SP size a step may use up to ``max_sp_size``, split, and micro-batch
    of copies of its own length (:func:`~datacentric.planning.sample_price.sample_price`).
    It ignores mixed micro-batches and recomputing some blocks, so a schedule can
    beat it. ``searched(done, total)`` hears the count of distinct shapes priced (each
    a search, up to a millisecond or so)."""
    view = table.view
    ids = np.asarray(ids, dtype=np.int64)
    out = np.zeros(len(ids))
    sizes = bound_sizes(table)
    buckets = view.bucket_of[ids]
    groups = []  # (rows, the shapes to price in order, each row's index among them)
    for b in np.unique(buckets).tolist():
        rows = np.flatnonzero(buckets == b)
        if view.uniform[b] or view.buckets[b].shape.grid is not None:
            keys = [view.shapes[int(i)] for i in ids[rows]]
            index = {k: j for j, k in enumerate(dict.fromkeys(keys))}
            groups.append((rows, list(index), np.array([index[k] for k in keys], np.int64)))
            continue
        floors, class_of = length_classes(view.tokens[ids[rows]])
        # longest first: each search starts from the last, scaled to the new length
        longest_first = [SampleShape.text(int(n)) for n in floors[::-1]]
        groups.append((rows, longest_first, len(floors) - 1 - np.asarray(class_of)))
    total, done = sum(len(shapes) for _, shapes, _ in groups), 0
    for rows, shapes, index in groups:
        prices = []
        for shape in shapes:
            prices.append(_price(table, shape, sizes))
            done += 1
            if searched is not None:
                searched(done, total)
        out[rows] = np.asarray(prices)[index]
    return _priced_past(table, sizes, out, lambda rows, wider: _old_prices(table, ids[rows], wider))


def _old_prices(table: OptionTable, ids: np.ndarray, sizes: list[int]) -> np.ndarray:
    """:func:`old_gpu_seconds` of ``ids`` on ``sizes``, each sample at its own shape."""
    return np.array([_price(table, table.view.shapes[int(i)], sizes) for i in ids])


def bound_sizes(table: OptionTable) -> list[int]:
    """The SP sizes the bounds price samples on: every size a step may use, up to
    ``max_sp_size`` (the world when not given); a sample that fits none of them is
    priced on every size a step may use (:func:`_priced_past`)."""
    top = table.max_sp_size or table.world_size
    return [s for s in table.all_sizes if s <= top]


def _price(table: OptionTable, shape: SampleShape, sizes: list[int]) -> float:
    """:func:`sample_price` of ``shape``, memoised on ``table``."""
    key = (shape, "price", tuple(sizes))
    if key not in table.prices:
        limit = table.plan.option_batch_limit
        table.prices[key] = sample_price(
            table.cost_model, shape, sizes, table.cap, limit, table.price_guesses
        )
    return table.prices[key]


def _fastest(table: OptionTable, shape: SampleShape, sizes: list[int]) -> float:
    """:func:`fastest_run` of ``shape``, memoised on ``table``."""
    key = (shape, "fastest", tuple(sizes))
    if key not in table.prices:
        table.prices[key] = fastest_run(table.cost_model, shape, sizes, table.cap)
    return table.prices[key]


def step_bound_s(
    table: OptionTable,
    ids: np.ndarray,
    world_size: int,
    gpu_seconds: np.ndarray | None = None,
    *,
    sizes: list[int] | None = None,
    recompute: str | None = None,
) -> float:
    """A lower bound on the makespan of the step of samples ``ids`` (see the module
    doc): the larger of their ideal GPU-seconds over the world and the fastest time
    any SP size the model runs (up to ``--max-sp-size`` when given, else the world) gives
    the step's slowest single sample. Each bucket's longest member stands for its
    bucket (a longer sample of one bucket never runs faster). ``gpu_seconds``: the
    samples' :func:`sample_gpu_seconds`, when already known. ``sizes`` and
    ``recompute``: the bound of a step that runs only those (:func:`sample_gpu_seconds`)."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return 0.0
    view = table.view
    sizes = bound_sizes(table) if sizes is None else list(sizes)
    slowest = 0.0
    buckets = view.bucket_of[ids]
    for b in np.unique(buckets).tolist():
        members = ids[buckets == b]
        longest = int(members[np.argmax(view.tokens[members])])
        fastest = _fastest(table, view.shapes[longest], sizes)
        if not np.isfinite(fastest):  # on larger groups, as in _priced_past
            fastest = _fastest(table, view.shapes[longest], list(table.all_sizes))
        if np.isfinite(fastest):
            slowest = max(slowest, fastest)
    if gpu_seconds is None:
        gpu_seconds = sample_gpu_seconds(table, ids, sizes, recompute)
    return max(float(np.sum(gpu_seconds)) / world_size, slowest)


def overlaps_grad_sync(cost_model: CostModel, world_size: int) -> bool:
    """Whether the run's ``shard`` setting reduces gradients inside the last backward
    (cost models without a setting: yes, as DDP and FSDP2 do)."""
    sharding = getattr(cost_model, "sharding", None)
    return sharding is None or sharding.overlaps_reduction(world_size)


def backward_s(cost: PassBreakdown) -> float:
    """The window a pass's backward gives the gradient sync: its time minus its
    forward (the forward taken as a third of the pass without recomputation, the usual
    1:2 forward:backward FLOPs; approximate), less the seconds its ring traffic holds
    the inter-node link the sync needs (``PassBreakdown.inter_node_backward_s``)."""
    backward = cost.time_s - (cost.time_s - cost.recompute_s) / 3
    return max(0.0, backward - cost.inter_node_backward_s)


def exposed_grad_sync_s(reduction_s: float, window_s: float | None) -> float:
    """The exposed part of a step's gradient reduction of ``reduction_s`` seconds:
    all of it without an overlap window (``None``), else what outlasts the window
    (the backward of the last micro-batch of the group that finishes last: faster
    groups' ranks are already waiting, and gradient buckets reduce as they become
    final). ``benchmarks/grad_overlap.py`` measured DDP and FSDP2 hiding the reduction
    of its small model entirely; this model is approximate."""
    if window_s is None:
        return reduction_s
    return max(0.0, reduction_s - window_s)


def estimated_grad_sync_s(
    it: Iteration,
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    reduction_s: float,
    overlap: bool,
) -> float:
    """The exposed gradient sync of ``it`` under the scheduler's estimates: the rule
    of :func:`exposed_grad_sync_s` on the estimated timeline (the simulator applies
    it to the simulated one)."""
    if not overlap or reduction_s <= 0 or not it.assignments:
        return exposed_grad_sync_s(reduction_s, None)
    timeline = phase_timeline(it, lambda g: g.est_time_s)
    makespan = max(end for _, _, end in timeline)
    windows = []
    for g, _, end in timeline:
        if end != makespan or not g.micro_batches:
            continue
        mb = g.micro_batches[-1]
        recompute = mb.recompute or (False,) * cost_model.num_blocks
        mb_shapes = [shapes[i] for i in mb.sample_ids]
        cost = split_breakdown(cost_model, mb_shapes, g.sp_size, recompute, mb.ring_size)
        windows.append(backward_s(cost))
    return exposed_grad_sync_s(reduction_s, min(windows) if windows else None)


def epoch_estimate_s(
    iterations: Sequence[Iteration],
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    world_size: int,
) -> float:
    """Estimated time of ``iterations``: their makespans plus the exposed gradient sync
    (:func:`estimated_grad_sync_s`), what ``efficiency`` charges; the searches of
    ``static`` and ``megatron-dyncp`` price their finalists with it."""
    reduction = float(cost_model.grad_sync_time_s(world_size))
    overlap = overlaps_grad_sync(cost_model, world_size)
    return sum(
        it.est_makespan_s + estimated_grad_sync_s(it, cost_model, shapes, reduction, overlap)
        for it in iterations
    )


def iteration_imbalance(it: Iteration, world_size: int) -> float:
    """Idle share of the iteration's GPU time by the micro-batches' estimates (never
    below 0: a step of whole-world phases sums the same times in two orders)."""
    span = it.est_makespan_s
    if span <= 0:
        return 0.0
    busy = sum(a.sp_size * a.est_time_s for a in it.assignments)
    return max(0.0, 1.0 - busy / (world_size * span))


def schedule_measures(
    schedule: Schedule,
    cost_model: CostModel,
    ideal_epoch_time_s: float | None,
    *,
    shapes: Sequence[SampleShape] | None = None,
    step_bounds_s: Sequence[float] | None = None,
) -> dict[str, float | list[float] | None]:
    """Imbalance per iteration and mean, estimated epoch time and efficiency (and
    ``efficiency_makespan_only``: the same bound over the makespans plus every
    step's whole gradient reduction, none of it hidden).

    With the dataset's ``shapes`` the gradient sync is charged as the simulator
    charges it (:func:`estimated_grad_sync_s`); without, all of it is exposed.
    ``step_bounds_s`` (:func:`step_bound_s` per iteration) adds
    ``step_bound_epoch_time_s`` and ``efficiency_step_bound``."""
    world = schedule.world_size
    imbalance = [iteration_imbalance(it, world) for it in schedule.iterations]
    reduction = float(cost_model.grad_sync_time_s(world))
    overlap = shapes is not None and overlaps_grad_sync(cost_model, world)
    syncs = [
        estimated_grad_sync_s(it, cost_model, shapes, reduction, overlap) if shapes else reduction
        for it in schedule.iterations
    ]
    makespans = sum(it.est_makespan_s for it in schedule.iterations)
    epoch = makespans + sum(syncs)
    whole = makespans + reduction * len(schedule.iterations)  # every sync charged whole
    tokens = [it.num_tokens for it in schedule.iterations] or [0]
    return {
        "tokens_per_step_mean": float(np.mean(tokens)),
        "tokens_per_step_max": int(max(tokens)),
        "imbalance": imbalance,
        "imbalance_mean": float(np.mean(imbalance)) if imbalance else 0.0,
        "est_epoch_time_s": epoch,
        "ideal_epoch_time_s": ideal_epoch_time_s,
        "efficiency": (ideal_epoch_time_s / epoch) if ideal_epoch_time_s and epoch > 0 else None,
        "efficiency_makespan_only": (
            ideal_epoch_time_s / whole if ideal_epoch_time_s and whole > 0 else None
        ),
        "grad_sync_exposed_s": float(sum(syncs)),
        **step_bound_measures(step_bounds_s, epoch),
    }


def step_bound_measures(step_bounds_s: Sequence[float] | None, epoch_s: float) -> dict:
    """``step_bound_epoch_time_s`` and ``efficiency_step_bound`` (empty without bounds)."""
    if step_bounds_s is None:
        return {}
    total = float(sum(step_bounds_s))
    return {
        "step_bound_epoch_time_s": total,
        "efficiency_step_bound": total / epoch_s if epoch_s > 0 else None,
    }
