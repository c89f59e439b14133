"""Placing micro-batches on a layout of SP groups: their time on each group size,
splitting for tail iterations, and LPT with local search."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datacentric.scheduling import balance
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import split_item
from datacentric.scheduling.option_table import OptionTable


def time_matrix(table: OptionTable, items: Sequence[Item], sizes: Sequence[int]) -> np.ndarray:
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


def assign_to_layout(
    items: list[Item], layout: list[int], table: OptionTable, world_size: int, *, max_moves: int = 0
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
