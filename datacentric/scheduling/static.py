"""``static``: the best single configuration for the whole run, found by search.

One SP size, one recomputation setting (none or every block) and one micro-batch
size (a token budget, capped per bucket by what fits the memory cap) for all data;
accumulation follows from the global batch: each step's micro-batches are dealt to
the ``world / sp`` equal data-parallel groups longest first (LPT). The configuration
is the one with the least estimated epoch time among every SP size within a node
(larger only when nothing fits within), both recomputation settings and micro-batch
budgets in powers of two: every candidate priced on a few steps spread over the
epoch, the best (setting, size) again on budgets ``2**(1/4)`` apart, then the best
:data:`FINALISTS` of all on every step (:mod:`~datacentric.scheduling.search_steps`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datacentric.planning.cost_model import split_breakdown
from datacentric.schedule import Iteration
from datacentric.scheduling.item import Item
from datacentric.scheduling.measures import (
    backward_s,
    epoch_estimate_s,
    exposed_grad_sync_s,
    overlaps_grad_sync,
)
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import assign_to_layout, time_matrix
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput, StepMaker
from datacentric.scheduling.search_steps import priced_steps, searched

#: Candidates re-priced on every step after the first pass.
FINALISTS = 6


def uniform_sizes(inp: PolicyInput, table: OptionTable) -> list[int]:
    """SP sizes on which every active bucket fits: within a node, or else the
    smallest larger one."""
    buckets = inp.active_buckets()
    ok = [s for s in table.all_sizes if all(table.config(b, s) is not None for b in buckets)]
    inside = [s for s in ok if s in table.node_sizes]
    return inside or ok[:1]


def uniform_sp(inp: PolicyInput, table: OptionTable) -> int:
    """The smallest SP size on which every active bucket fits."""
    sizes = uniform_sizes(inp, table)
    if not sizes:
        table.preferred(max(inp.active_buckets(), key=lambda b: inp.view.rep_tokens(b)))
        raise ValueError(f"no single SP size up to {inp.world_size} fits every bucket")
    return sizes[0]


def budget_items(
    inp: PolicyInput, table: OptionTable, ids: np.ndarray, sp: int, budget: float
) -> list[Item]:
    """A global batch's samples, per bucket, in micro-batches of at most ``budget``
    tokens (at least one sample; at most the bucket's largest micro-batch on ``sp``)."""
    view = inp.view
    buckets = view.bucket_of[ids]
    items: list[Item] = []
    for b in np.unique(buckets).tolist():
        cfg = table.config(b, sp)
        units = min(float(cfg.max_batch), max(1.0, budget / view.rep_tokens(b)))
        items += pack(table, b, ids[buckets == b], units)
    return items


def equal_groups(
    inp: PolicyInput, table: OptionTable, sp: int, items: list[Item]
) -> list[tuple[int, list[Item]]]:
    """``items`` dealt longest first to ``world / sp`` groups of ``sp`` ranks."""
    n_groups = max(1, inp.world_size // sp)
    return assign_to_layout(items, [sp] * n_groups, table, inp.world_size)


def step_time(table: OptionTable, groups: list[tuple[int, list[Item]]]) -> float:
    """Estimated makespan of a step's groups."""
    return max(group_times(table, groups))


def group_times(table: OptionTable, groups: list[tuple[int, list[Item]]]) -> list[float]:
    """Estimated time of each of a step's groups."""
    return [float(time_matrix(table, items, [sp])[:, 0].sum()) for sp, items in groups]


def step_estimate(
    inp: PolicyInput, table: OptionTable, groups: list[tuple[int, list[Item]]]
) -> float:
    """A step's makespan plus its exposed gradient sync, by the rule ``efficiency``
    charges (:func:`~datacentric.scheduling.measures.exposed_grad_sync_s`)."""
    times = group_times(table, groups)
    top = max(times)
    world = inp.world_size
    reduction = float(inp.cost_model.grad_sync_time_s(world))
    if reduction <= 0 or not overlaps_grad_sync(inp.cost_model, world):
        return top + reduction
    windows = []
    for (sp, items), t in zip(groups, times):
        if t == top and items:
            last = items[-1]
            option = table.item_option(last, sp)[0] or table.config(last.bucket, sp)
            shapes = [inp.view.shapes[i] for i in last.ids]
            cost = split_breakdown(inp.cost_model, shapes, sp, option.recompute, option.ring_size)
            windows.append(backward_s(cost))
    return top + exposed_grad_sync_s(reduction, min(windows) if windows else None)


def budgets(inp: PolicyInput, table: OptionTable, sp: int) -> list[float]:
    """Micro-batch token budgets tried: powers of two from the shortest bucket's
    representative to the largest micro-batch any bucket fits."""
    reps = [inp.view.rep_tokens(b) for b in inp.active_buckets()]
    top = max(table.config(b, sp).max_batch * inp.view.rep_tokens(b) for b in inp.active_buckets())
    out, b = [], float(min(reps))
    while b < top:
        out.append(b)
        b *= 2
    return out + [float(top)]


def price(
    inp: PolicyInput,
    table: OptionTable,
    sp: int,
    budget: float,
    chunks: list[np.ndarray],
    priced: Callable[[int], None] | None = None,
) -> float:
    """Estimated time of ``chunks`` under one configuration, makespans plus exposed
    gradient sync (ValueError: it cannot cover the world); ``priced(k)`` hears that the
    first ``k`` chunks are priced, before the last."""
    total = 0.0
    for k, c in enumerate(chunks):
        if k and priced is not None:
            priced(k)
        groups = equal_groups(inp, table, sp, budget_items(inp, table, c, sp, budget))
        total += step_estimate(inp, table, groups)
    return total


def search(inp: PolicyInput, told: Told | None = None) -> tuple[OptionTable, int, float]:
    """The (recomputation table, SP size, token budget) with the least estimated time
    (its progress told to ``told``, in steps priced: :func:`~.search_steps.searched`)."""
    told = told or Told(inp)
    first = first_pass(inp, told)
    told.finalists(first)
    if not first:
        table = inp.full_table()
        sp = uniform_sp(inp, table)
        return table, sp, float(budgets(inp, table, sp)[0])
    best: tuple[float, OptionTable, int, float] | None = None
    for n, (table, sp, budget) in enumerate(first[:FINALISTS]):
        try:
            t = epoch_estimate_s(
                build(inp, table, sp, budget, told.at(n)),
                inp.cost_model,
                inp.view.shapes,
                inp.world_size,
            )
        except ValueError:
            continue
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, table, sp, budget)
    if best is None:  # no finalist covers the world on every step
        return first[0]
    return best[1], best[2], best[3]


class Told:
    """``static``'s search and build told as the micro-batches they price (a step's
    cost grows with them: small budgets make many): the first pass's candidates, each
    on a few steps, then each finalist's and the chosen one's every step."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        chunks, _ = inp.global_batches()
        self.chunks = chunks
        ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
        self.counts = np.bincount(inp.view.bucket_of[ids])
        self.first = 0.0
        """Micro-batches priced in the first pass (its estimate, then its count)."""
        self.builds: list[float] = []
        """Micro-batches of each finalist's epoch, then the chosen one's."""

    def work(self, table: OptionTable, sp: int, budget: float, share: float = 1.0) -> float:
        """Micro-batches :func:`budget_items` makes of ``share`` of the epoch's samples
        under one configuration (at least one a bucket)."""
        view, total = self.inp.view, 0.0
        for b in np.flatnonzero(self.counts).tolist():
            cfg = table.config(b, sp)
            units = min(float(cfg.max_batch), max(1.0, budget / view.rep_tokens(b)))
            total += max(1.0, share * self.counts[b] / units)
        return total

    def total(self) -> float:
        """Micro-batches of the search and the build, as counted now."""
        return self.first + sum(self.builds)

    def first_pass(self, done: float, total: float, builds: list[float]) -> None:
        """The first pass has priced ``done`` of its ``total`` micro-batches; ``builds``:
        the epochs the finalists would build as they stand so far."""
        self.first, self.builds = total, builds
        searched(self.inp, done, self.total())

    def finalists(self, first: list[tuple[OptionTable, int, float]]) -> None:
        """The finalists' epochs counted as they are (the chosen one's like the first)."""
        builds = [self.work(t, sp, b) for t, sp, b in first[:FINALISTS]]
        self.builds = builds + builds[:1]

    def at(self, build: int) -> Callable[[int], None]:
        """Told the steps built by the ``build``-th epoch (``FINALISTS``: the chosen one);
        told nothing where no finalist was counted (a first pass that found no candidate:
        :func:`search`'s fallback)."""
        if not self.builds:
            return lambda k: None
        build = min(build, len(self.builds) - 1)
        base = self.first + sum(self.builds[:build])
        per_step = self.builds[build] / max(len(self.chunks), 1)
        return lambda k: searched(self.inp, base + k * per_step, self.total())


def first_pass(inp: PolicyInput, told: Told | None = None) -> list[tuple[OptionTable, int, float]]:
    """Every (recomputation table, SP size, token budget) candidate that covers the
    world on a few steps spread over the epoch, fastest there first: budgets in powers
    of two, then the best (setting, size) again on budgets ``2**(1/4)`` apart.
    ``told``: hears the micro-batches priced so far (:meth:`Told.first_pass`)."""
    chunks, _ = inp.global_batches()
    sample = [chunks[k] for k in priced_steps(len(chunks))]
    first: list[tuple[float, int, OptionTable, int, float]] = []
    tables = (inp.table("none", lambda o: not any(o.recompute)), inp.full_table())
    grid = [
        (n, t, sp, budgets(inp, t, sp))
        for n, t in enumerate(tables)
        for sp in uniform_sizes(inp, t)
    ]
    share = sum(len(c) for c in sample) / max(sum(len(c) for c in chunks), 1)
    work = told.work if told is not None else None
    priced, total, epoch = [0.0], 0.0, 0.0
    if work is not None:  # the finer budgets as many again as a (setting, size)'s most
        sums = [sum(work(t, sp, b, share) for b in bs) for _, t, sp, bs in grid]
        finer = [sum(work(t, sp, b, share) for b in finer_budgets(bs)) for _, t, sp, bs in grid]
        total = sum(sums) + sum(finer) / max(len(finer), 1)  # one (setting, size)'s finer
        epoch = sum(sums) / max(sum(len(bs) for *_, bs in grid), 1) / max(share, 1e-9)

    def builds() -> list[float]:
        """The finalists' epochs as the candidates priced so far rank them (before
        any: a mean candidate's), the chosen one's like the first's."""
        if work is None or not first:
            return [epoch] * (FINALISTS + 1)
        top = [work(t, sp, b) for *_, t, sp, b in sorted(first, key=lambda r: r[:2])[:FINALISTS]]
        return top + top[:1]

    # a candidate's micro-batches told as its sampled steps are priced, a step's share
    # by its samples: the first candidate pays the pricing tables' start, and a count
    # after each of its steps gives the search a pace long before the second (2.8 s of
    # CPU on sft-longtail at 64 GPUs)
    shares = np.cumsum([len(c) for c in sample]) / max(sum(len(c) for c in sample), 1)

    def try_one(n: int, table: OptionTable, sp: int, budget: float) -> None:
        tell = None
        if told is not None and work is not None:
            ranked = builds()  # the candidates priced so far: the same till this one is
            told.first_pass(priced[0], max(total, priced[0]), ranked)
            before, candidate = priced[0], work(table, sp, budget, share)
            priced[0] += candidate

            def tell(k: int) -> None:
                done = before + candidate * float(shares[k - 1])
                told.first_pass(done, max(total, done), ranked)

        try:
            first.append((price(inp, table, sp, budget, sample, tell), n, table, sp, budget))
        except ValueError:  # too few micro-batches to cover the world
            pass

    for n, table, sp, coarse in grid:
        for budget in coarse:
            try_one(n, table, sp, budget)
    if not first:
        return []
    first.sort(key=lambda row: row[:2])
    _, n, table, sp, _ = first[0]
    for budget in finer_budgets(budgets(inp, table, sp)):
        try_one(n, table, sp, budget)
    if told is not None:
        told.first_pass(priced[0], priced[0], builds())
    first.sort(key=lambda row: row[:2])
    return [row[2:] for row in first]


def finer_budgets(coarse: list[float]) -> list[float]:
    """The budgets ``2**(1/4)`` apart between the powers of two ``coarse``."""
    finer = (coarse[0] * 2 ** (k / 4) for k in range(4 * len(coarse)) if k % 4)
    return [budget for budget in finer if budget <= coarse[-1]]


def step_makers(inp: PolicyInput) -> list[StepMaker]:
    """The steps ``static``'s finalists would run, one maker each (``dcp-opt``'s
    portfolio tries every one on every step; a step whose samples cannot cover the
    world under one raises ``ValueError``)."""
    first = first_pass(inp)
    if not first:
        table = inp.full_table()
        sp = uniform_sp(inp, table)
        first = [(table, sp, float(budgets(inp, table, sp)[0]))]
    return [
        lambda k, chunk, table=table, sp=sp, budget=budget: step(inp, table, sp, budget, k, chunk)
        for table, sp, budget in first[:FINALISTS]
    ]


def settings_of(inp: PolicyInput, table: OptionTable, sp: int, budget: float) -> dict:
    """What ``static`` chose, for ``Schedule.meta['settings']``."""
    return {
        "sp_size": sp,
        "recompute": "full" if table is inp.full_table() else "none",
        "token_budget": int(budget),
    }


def build(
    inp: PolicyInput,
    table: OptionTable,
    sp: int,
    budget: float,
    told: Callable[[int], None] | None = None,
) -> list[Iteration]:
    """Every step of the epoch under one configuration; ``told(k)``: ``k`` steps built."""
    chunks, _ = inp.global_batches()
    steps = []
    for k, c in enumerate(chunks):
        steps.append(step(inp, table, sp, budget, k, c))
        if told is not None:
            told(k + 1)
    return steps


def step(
    inp: PolicyInput, table: OptionTable, sp: int, budget: float, k: int, chunk: np.ndarray
) -> Iteration:
    """Step ``k`` of the global batch ``chunk`` under one configuration."""
    items = budget_items(inp, table, chunk, sp, budget)
    return emit_iteration(k, inp.world_size, equal_groups(inp, table, sp, items), table)


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``static`` policy."""
    told = Told(inp)
    table, sp, budget = search(inp, told)
    _, dropped = inp.global_batches()
    settings = settings_of(inp, table, sp, budget)
    iterations = build(inp, table, sp, budget, told.at(FINALISTS))
    return PolicyOutput(iterations=iterations, dropped=dropped, settings=settings)
