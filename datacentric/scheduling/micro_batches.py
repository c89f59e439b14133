"""Micro-batches under construction, and turning groups of them into an Iteration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datacentric.planning.heads import mixable_sp_sizes
from datacentric.progress import counted
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.scheduling.item import Item
from datacentric.scheduling.option_table import OptionTable


def pack(
    table: OptionTable, b: int, ids: Sequence[int], units: float, *, sort: bool = True
) -> list[Item]:
    """Split bucket ``b``'s samples ``ids`` into micro-batches of at most ``units``
    representatives each (samples for uniform buckets, tokens over the
    representative's tokens for text buckets; at least one sample each).

    ``sort`` packs the longest first (next-fit over lengths in descending order,
    which leaves every micro-batch but the last nearly full); otherwise ``ids``'
    order is kept.
    """
    view = table.view
    ids_arr = np.asarray(ids, dtype=np.int64)
    if len(ids_arr) == 0:
        return []
    if view.uniform[b]:
        size = max(1, int(units))
        tok = view.rep_tokens(b)
        flat = ids_arr.tolist()
        return [
            Item(b, flat[at : at + size], tok * len(flat[at : at + size]))
            for at in range(0, len(flat), size)
        ]
    tokens = view.tokens[ids_arr]
    if sort:
        order = np.argsort(-tokens, kind="stable")
        ids_arr, tokens = ids_arr[order], tokens[order]
    budget = units * view.rep_tokens(b)
    cuts = next_fit_cuts(tokens.tolist(), budget)
    sums = np.add.reduceat(tokens, np.asarray([0, *cuts], dtype=np.int64)).tolist()
    flat = ids_arr.tolist()
    bounds = [0, *cuts, len(flat)]
    return [Item(b, flat[lo:hi], total) for lo, hi, total in zip(bounds, bounds[1:], sums)]


def next_fit_cuts(tokens: list[int], budget: float) -> list[int]:
    """Where next-fit packing of ``tokens`` into bins of ``budget`` starts a new bin."""
    cuts = []
    used = 0
    for i, t in enumerate(tokens):
        if used + t > budget and used:
            cuts.append(i)
            used = 0
        used += t
    return cuts


def split_item(item: Item, table: OptionTable) -> tuple[Item, Item]:
    """Halve a micro-batch of two or more samples (tail iterations need more of them)."""
    half = item.count // 2
    first, second = item.ids[:half], item.ids[half:]
    return make_item(table, first, item.mixed), make_item(table, second, item.mixed)


def make_item(table: OptionTable, ids: Sequence[int], mixed: bool = True) -> Item:
    """An item of samples ``ids``; named by its longest sample's bucket."""
    view = table.view
    arr = np.asarray(ids, dtype=np.int64)
    buckets = view.bucket_of[arr]
    b = int(buckets[np.argmax(view.tokens[arr])])
    return Item(b, arr.tolist(), int(view.tokens[arr].sum()), mixed and bool((buckets != b).any()))


def place_groups(world_size: int, sizes: Sequence[int]) -> list[int]:
    """Rank starts for groups of ``sizes`` (each a power of two dividing the world, or
    the whole world) laid out largest first: every start is then a multiple of its
    size. Returns starts in the order of ``sizes``."""
    if sum(sizes) != world_size:
        raise ValueError(f"group sizes {sorted(sizes)} do not add up to world size {world_size}")
    order = sorted(range(len(sizes)), key=lambda g: -sizes[g])
    starts = [0] * len(sizes)
    at = 0
    for g in order:
        if at % sizes[g]:
            raise ValueError(f"group of size {sizes[g]} would start unaligned at rank {at}")
        starts[g] = at
        at += sizes[g]
    return starts


def emit_iteration(
    index: int,
    world_size: int,
    groups: Sequence[tuple[int, Sequence[Item]]],
    table: OptionTable,
    *,
    placed: Sequence[tuple[int, int]] | None = None,
) -> Iteration:
    """Build the :class:`Iteration` for ``groups`` of ``(sp_size, items)``.

    Each micro-batch gets the recomputation and the Ulysses x ring split
    (``ring_size``) of the table's fastest option for it on that SP size
    (:meth:`OptionTable.item_option`) and the cost model's time for its actual samples.
    Groups are laid out largest first in one phase, or where ``placed`` says:
    ``(rank_start, phase)`` per group.
    """
    view = table.view
    sizes = [sp for sp, _ in groups]
    if placed is None:
        placed = [(start, 0) for start in place_groups(world_size, sizes)]
    settings = []
    by_size: dict[int, list[Item]] = {}
    for sp, items in groups:
        by_size.setdefault(sp, []).extend(items)
    chosen = {sp: iter(table.item_options(items, sp)) for sp, items in by_size.items()}
    for sp, items in groups:
        for item in items:
            cfg = next(chosen[sp]) or table.config(item.bucket, sp)
            if cfg is None:
                bucket = view.buckets[item.bucket]
                raise ValueError(
                    f"iteration {index}: bucket {bucket.name!r} does not fit on an SP "
                    f"group of {counted(sp, 'rank')} under the memory cap (or the model rejects "
                    f"SP {sp}); too few samples to cover {counted(world_size, 'rank')} otherwise — "
                    "use drop_remainder=True or a smaller world"
                )
            settings.append((item, sp, table.micro_batch_recompute(item, sp, cfg), cfg.ring_size))
    estimates = table.estimates(settings)
    names = [bk.name for bk in view.buckets]
    micro_batches = [
        MicroBatch(
            sample_ids=tuple(item.ids),
            bucket=names[item.bucket],
            tokens=int(item.tokens),
            recompute=rc,
            est_time_s=est,
            packed=item.count > 1,
            ring_size=ring,
        )
        for (item, _, rc, ring), est in zip(settings, estimates)
    ]
    assignments = []
    at = 0
    for (sp, items), (start, phase) in zip(groups, placed):
        mbs = tuple(micro_batches[at : at + len(items)])
        at += len(items)
        assignments.append(Assignment(rank_start=start, sp_size=sp, micro_batches=mbs, phase=phase))
    assignments.sort(key=lambda a: (a.phase, a.rank_start))
    iteration = Iteration(index=index, assignments=tuple(assignments))
    check_layout(iteration, world_size)
    return iteration


def check_layout(iteration: Iteration, world_size: int) -> None:
    """Raise ``ValueError`` unless every phase of ``iteration`` tiles the ranks with
    aligned groups (each starting at a multiple of its size) of sizes a step may use
    (:func:`~datacentric.planning.heads.mixable_sp_sizes`: a group that is not
    a power of two holds the whole world, alone in its phase): the runtime has a
    process group for exactly those."""
    iteration.validate(world_size)
    allowed = mixable_sp_sizes(world_size)
    for a in iteration.assignments:
        if a.sp_size not in allowed or a.rank_start % a.sp_size:
            raise ValueError(
                f"iteration {iteration.index}, phase {a.phase}: a group of {a.sp_size} ranks "
                f"at rank {a.rank_start} at world size {world_size} (groups are aligned, of "
                f"sizes {allowed}); the policy laid it out wrong"
            )
