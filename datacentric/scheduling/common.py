"""Pieces the policies share: their input, batching of the epoch, and placing items
on a layout of groups."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Iteration
from datacentric.scheduling import balance
from datacentric.scheduling.context import CostTable, DatasetView
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import split_item
from datacentric.scheduling.options import ScheduleOptions

#: Up to this many scheduled samples, every micro-batch's estimate is the cost model's
#: own answer by default (``ScheduleOptions.exact_estimates``).
EXACT_ESTIMATE_SAMPLES = 200_000


@dataclass
class PolicyInput:
    """Everything a policy needs; built once by ``build_schedule``."""

    view: DatasetView
    cost_model: CostModel
    world_size: int
    options: ScheduleOptions
    plan: Plan | None
    rng: np.random.Generator
    active: np.ndarray
    """Sample ids to schedule (ascending)."""
    memory_cap_bytes: int
    tables: dict[str, CostTable] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return int(self.cost_model.num_blocks)

    def table(
        self, name: str, recomputes: Callable[[int], Sequence[tuple[bool, ...]]]
    ) -> CostTable:
        """A cost table over ``recomputes`` (cached under ``name`` for this call)."""
        if name not in self.tables:
            self.tables[name] = CostTable(
                self.view,
                self.cost_model,
                world_size=self.world_size,
                memory_cap_bytes=self.memory_cap_bytes,
                max_sp_size=self.options.max_sp_size,
                max_micro_batch_size=self.options.max_micro_batch_size,
                recomputes=recomputes,
                exact_estimates=self.exact_estimates,
            )
        return self.tables[name]

    def __post_init__(self) -> None:
        self.active_mask = np.zeros(self.view.num_samples, dtype=bool)
        self.active_mask[self.active] = True
        exact = self.options.exact_estimates
        self.exact_estimates = (
            len(self.active) <= EXACT_ESTIMATE_SAMPLES if exact is None else exact
        )

    def bucket_ids(self, b: int) -> np.ndarray:
        """Active sample ids of bucket ``b``, ascending."""
        members = self.view.members[b]
        return members[self.active_mask[members]]

    def active_buckets(self) -> list[int]:
        """Buckets with at least one sample to schedule."""
        present = np.unique(self.view.bucket_of[self.active])
        return [int(b) for b in present]

    def uniform_table(self) -> CostTable:
        """The table of one recomputation setting for all data: none if every active
        bucket fits without it on some SP size within a node, else every block."""
        none = (False,) * self.num_blocks
        full = (True,) * self.num_blocks
        probe = self.table("none", lambda b: [none])
        ok = all(
            any(probe.config(b, s) is not None for s in probe.node_sizes)
            for b in self.active_buckets()
        )
        return probe if ok else self.table("full", lambda b: [full])

    def pac_table(self) -> CostTable:
        """Per-bucket recomputation: none, every block, or the plan's knapsack choice,
        whichever costs fewest GPU-seconds per sample where it fits."""
        none = (False,) * self.num_blocks
        full = (True,) * self.num_blocks
        names = [bk.name for bk in self.view.buckets]

        def candidates(b: int) -> list[tuple[bool, ...]]:
            out = [none, full]
            if self.plan is not None and names[b] in self.plan.buckets:
                rc = tuple(self.plan.buckets[names[b]].recompute)
                if len(rc) == self.num_blocks:
                    out.append(rc)
            return out

        return self.table("pac", candidates)


@dataclass
class PolicyOutput:
    """Iterations of a policy and the samples it dropped on request."""

    iterations: list[Iteration]
    dropped: list[int] = field(default_factory=list)


def default_tokens_per_iteration(view: DatasetView, active: np.ndarray, world_size: int) -> int:
    """``world * max(2**18, longest sample)`` tokens: each rank gets at least one
    longest sample's worth of work, and a quarter-million tokens otherwise."""
    longest = int(view.tokens[active].max())
    return world_size * max(2**18, longest)


def batch_weights(inp: PolicyInput, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-sample weight and the bound of the global batch, in tokens or samples."""
    opts = inp.options
    if opts.samples_per_iteration is not None:
        return np.ones(len(order), dtype=np.int64), int(opts.samples_per_iteration)
    bound = opts.tokens_per_iteration or default_tokens_per_iteration(
        inp.view, inp.active, inp.world_size
    )
    return inp.view.tokens[order], int(bound)


def chunk_fixed(inp: PolicyInput, order: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """Consecutive global batches of ``order``, each closed when the next sample would
    pass the bound (a sample larger than the bound makes a batch alone); the last,
    partial batch is dropped when the options ask for it."""
    weights, bound = batch_weights(inp, order)
    chunks: list[np.ndarray] = []
    start, used = 0, 0
    for i, w in enumerate(weights.tolist()):
        if i > start and used + w > bound:
            chunks.append(order[start:i])
            start, used = i, 0
        used += w
    last = order[start:]
    if inp.options.drop_remainder and used < bound and chunks:
        return chunks, last.tolist()
    chunks.append(last)
    return chunks, []


def chunk_even(inp: PolicyInput, order: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """``ceil(total / bound)`` global batches of nearly equal weight (so no tiny last
    one); with ``drop_remainder``, ``floor(total / bound)`` full batches and the rest
    of ``order`` dropped."""
    weights, bound = batch_weights(inp, order)
    cum = np.cumsum(weights)
    total = int(cum[-1])
    dropped: list[int] = []
    if inp.options.drop_remainder and total >= bound:
        k = total // bound
        keep = int(np.searchsorted(cum, k * bound, side="right"))
        dropped = order[keep:].tolist()
        order, cum, total = order[:keep], cum[:keep], int(cum[keep - 1])
    else:
        k = max(1, -(-total // bound))
    cuts = np.searchsorted(cum, total * np.arange(1, k) / k, side="left") + 1
    chunks = [c for c in np.split(order, cuts) if len(c)]
    return chunks, dropped


def stratified_order(inp: PolicyInput) -> np.ndarray:
    """The active samples interleaved so that every stretch holds each bucket in
    proportion to its size (each bucket shuffled; bucket ``b``'s ``i``-th sample sits
    at ``(i + u_b) / n_b`` with a random offset ``u_b``)."""
    view, rng = inp.view, inp.rng
    active = inp.active
    buckets = view.bucket_of[active]
    counts = np.bincount(buckets, minlength=len(view.buckets))
    perm = rng.permutation(len(active))
    shuffled, bshuf = active[perm], buckets[perm]
    by_bucket = np.argsort(bshuf, kind="stable")
    rank = np.empty(len(active), dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    rank[by_bucket] = np.arange(len(active)) - starts[bshuf[by_bucket]]
    offset = rng.random(len(view.buckets))
    key = (rank + offset[bshuf]) / counts[bshuf]
    return shuffled[np.argsort(key, kind="stable")]


def time_matrix(table: CostTable, items: Sequence[Item], sizes: Sequence[int]) -> np.ndarray:
    """``t[j, k]``: estimated time of item ``j`` on ``sizes[k]`` ranks (inf: no fit).

    Vectorised per bucket over its cost curve; single samples shorter than their
    representative and mixed micro-batches are asked of the cost model one by one."""
    view = table.view
    n = len(items)
    out = np.full((n, len(sizes)), np.inf)
    bucket = np.fromiter((it.bucket for it in items), dtype=np.int64, count=n)
    count = np.fromiter((it.count for it in items), dtype=np.int64, count=n)
    tokens = np.fromiter((it.tokens for it in items), dtype=np.int64, count=n)
    mixed = np.fromiter((it.mixed for it in items), dtype=bool, count=n)
    single = (count == 1) & ~view.uniform[bucket]
    special = mixed | single
    for b in np.unique(bucket).tolist():
        rows = np.flatnonzero((bucket == b) & ~special)
        if len(rows) == 0:
            continue
        units = count[rows] if view.uniform[b] else tokens[rows] / view.rep_tokens(b)
        for k, s in enumerate(sizes):
            cfg = table.config(b, s)
            if cfg is not None:
                out[rows, k] = cfg.times_for(units)
    for j in np.flatnonzero(special).tolist():
        for k, s in enumerate(sizes):
            out[j, k] = table.item_time(items[j], s)
    return out


def ensure_items(items: list[Item], needed: int, table: CostTable) -> list[Item]:
    """Split the largest multi-sample items until there are ``needed`` (or no more
    can be split): a tail iteration needs a micro-batch per group."""
    items = list(items)
    while len(items) < needed:
        splittable = [j for j, it in enumerate(items) if it.count > 1]
        if not splittable:
            break
        j = max(splittable, key=lambda j: (items[j].count, -j))
        a, b = split_item(items.pop(j), table)
        items += [a, b]
    return items


def assign_to_layout(
    items: list[Item], layout: list[int], table: CostTable, world_size: int, *, max_moves: int = 0
) -> list[tuple[int, list[Item]]]:
    """Place ``items`` on groups of ``layout`` sizes (merged until every group can get
    one) by LPT and optional local search. Returns ``(sp_size, items)`` per group."""
    items = ensure_items(items, len(layout), table)
    layout = balance.merge_groups(world_size, layout, len(items))
    while True:
        sizes = sorted(set(layout))
        times = time_matrix(table, items, sizes)
        group_class = np.asarray([sizes.index(s) for s in layout])
        fits = np.isfinite(times).any(axis=1)
        if not fits.all():
            j = int(np.flatnonzero(~fits)[0])
            if max(layout) == world_size:
                bucket = table.view.buckets[items[j].bucket].name
                raise ValueError(f"a micro-batch of bucket {bucket!r} fits no SP size available")
            layout = balance.merge_groups(world_size, layout, len(layout) - 1)
            continue
        owner, _ = balance.lpt(times, group_class, sizes)
        if max_moves:
            owner = balance.local_search(times, group_class, sizes, owner, max_moves)
        if balance.fill_empty(times, group_class, owner):
            break
        layout = balance.merge_groups(world_size, layout, len(layout) - 1)
    return [(s, [items[j] for j in np.flatnonzero(owner == g)]) for g, s in enumerate(layout)]
