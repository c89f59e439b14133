"""Placing micro-batches on a layout of SP groups: their time on each group size,
splitting for tail iterations, and LPT with local search."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datacentric.progress import counted
from datacentric.scheduling import balance
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import split_item
from datacentric.scheduling.option_table import OptionTable


def time_matrix(table: OptionTable, items: Sequence[Item], sizes: Sequence[int]) -> np.ndarray:
    """``t[j, k]``: estimated time of item ``j`` on ``sizes[k]`` ranks (inf: no fit),
    under the fastest of the table's options there that fits it
    (:meth:`~datacentric.scheduling.option_table.OptionTable.item_option`).

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
            out[rows, k] = table.times_for(b, s, units)
    for j in np.flatnonzero(special).tolist():
        for k, s in enumerate(sizes):
            out[j, k] = table.item_time(items[j], s)
    return out


def ensure_items(items: list[Item], needed: int, table: OptionTable) -> list[Item]:
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


def covering_items(
    items: list[Item], world_size: int, limit: int, table: OptionTable
) -> tuple[list[Item], list[int]]:
    """``items`` split (:func:`ensure_items`) into as many micro-batches as the fewest
    groups of at most ``limit`` ranks covering ``world_size`` ranks need, and their
    layout (single ranks merged pairwise, as
    :func:`~datacentric.scheduling.balance.merge_groups` merges them): a policy may pack
    a step's samples into fewer micro-batches (one bucket's, under a large memory
    budget) though the step holds a sample a group. A layout still past ``limit``
    means too few samples."""
    size = 1  # the groups merge_groups makes: a power of two dividing the world
    while 2 * size <= limit and world_size % (2 * size) == 0:
        size *= 2
    needed = 1 if limit >= world_size else world_size // size
    items = ensure_items(items, needed, table)
    return items, balance.merge_groups(world_size, [1] * world_size, len(items))


def largest_group(
    table: OptionTable, items: Sequence[Item], times: np.ndarray, sizes: Sequence[int]
) -> int:
    """The largest group size an iteration may use: ``--max-sp-size`` when given (more only
    where some micro-batch fits nothing smaller), and never a size no micro-batch
    runs on (the model may reject it, e.g. more ranks than attention heads)."""
    cap = table.max_sp_size or table.world_size
    fits = np.isfinite(times).any(axis=1)
    if not fits.all():
        bucket = table.view.buckets[items[int(np.flatnonzero(~fits)[0])].bucket]
        raise ValueError(f"a micro-batch of bucket {bucket.name!r} fits no SP size available")
    need = max(sizes[int(np.flatnonzero(np.isfinite(row))[0])] for row in times)
    runnable = [s for k, s in enumerate(sizes) if np.isfinite(times[:, k]).any()]
    return max(s for s in runnable if s <= max(cap, need))


def too_few(n_items: int, layout: list[int], limit: int, world_size: int) -> ValueError:
    """The error of an iteration whose micro-batches cannot cover the world; its fix is
    named as a command's flags and as the Python API's settings."""
    return ValueError(
        f"a global batch of {counted(n_items, 'micro-batch')} cannot cover "
        f"{counted(world_size, 'rank')} with groups of at most {counted(limit, 'rank')} "
        f"(layout {sorted(layout)}); raise the global batch (--global-batch-tokens / "
        "--global-batch-samples; in Python, DataCentric(..., tokens_per_iteration=)), raise "
        "--max-sp-size (SchedulingConfig(max_sp_size=)), or drop the remainder"
    )


def assign_to_layout(
    items: list[Item], layout: list[int], table: OptionTable, world_size: int, *, max_moves: int = 0
) -> list[tuple[int, list[Item]]]:
    """Place ``items`` on groups of ``layout`` sizes (merged until every group can get
    one, never past :func:`largest_group`) by LPT and optional local search.
    Returns ``(sp_size, items)`` per group."""
    items = ensure_items(items, len(layout), table)
    sizes_all = list(table.all_sizes)
    limit = largest_group(table, items, time_matrix(table, items, sizes_all), sizes_all)
    layout = balance.merge_groups(world_size, layout, len(items))
    if max(layout) > limit:  # merged for too few micro-batches, past what may run
        items, layout = covering_items(items, world_size, limit, table)
        limit = largest_group(table, items, time_matrix(table, items, sizes_all), sizes_all)
    while True:
        if max(layout) > limit:
            raise too_few(len(items), layout, limit, world_size)
        sizes = sorted(set(layout))
        times = time_matrix(table, items, sizes)
        group_class = np.asarray([sizes.index(s) for s in layout])
        fits = np.isfinite(times).any(axis=1)
        if not fits.all():
            layout = balance.merge_groups(world_size, layout, len(layout) - 1)
            continue
        owner, _ = balance.lpt(times, group_class, sizes)
        if max_moves:
            owner = balance.local_search(times, group_class, sizes, owner, max_moves)
        if balance.fill_empty(times, group_class, owner):
            break
        if len(layout) == 1:
            raise too_few(len(items), layout, limit, world_size)
        layout = balance.merge_groups(world_size, layout, len(layout) - 1)
    return [(s, [items[j] for j in np.flatnonzero(owner == g)]) for g, s in enumerate(layout)]


def place_at_sizes(
    items: list[Item], own: list[int], table: OptionTable, world_size: int, max_moves: int = 0
) -> list[tuple[int, list[Item]]]:
    """Groups for ``items`` that each run on their own SP size ``own[j]`` (the policies
    that fix a size per bucket): group sizes in proportion to each size's GPU-seconds,
    LPT and local search; when the step has too few micro-batches for that, they go
    wherever they fit (:func:`assign_to_layout`)."""
    sizes = sorted(set(own))
    cls = np.asarray([sizes.index(s) for s in own])
    own_time = np.empty(len(items))
    for k, s in enumerate(sizes):  # each item's time on its own size, one matrix per size
        rows = np.flatnonzero(cls == k)
        own_time[rows] = time_matrix(table, [items[j] for j in rows.tolist()], [s])[:, 0]
    times = np.full((len(items), len(sizes)), np.inf)
    times[np.arange(len(items)), cls] = own_time
    load = np.bincount(cls, weights=own_time * np.asarray(sizes)[cls], minlength=len(sizes))
    longest = np.zeros(len(sizes))
    np.maximum.at(longest, cls, own_time)
    count = np.bincount(cls, minlength=len(sizes))
    layout = balance.proportional_layout(world_size, sizes, load, len(items), longest, count)
    if set(layout) == set(sizes):
        group_class = np.asarray([sizes.index(s) for s in layout])
        owner, _ = balance.lpt(times, group_class, sizes)
        if max_moves:
            owner = balance.local_search(times, group_class, sizes, owner, max_moves)
        if balance.fill_empty(times, group_class, owner):
            return [
                (s, [items[j] for j in np.flatnonzero(owner == g)]) for g, s in enumerate(layout)
            ]
    return assign_to_layout(items, layout, table, world_size, max_moves=max_moves)
