"""``megatron-dyncp``: Megatron-Core's dynamic context parallel, as publicly described.

- A per-rank token limit ``C`` (``ScheduleOptions.megatron_tokens_per_rank``, by
  default the most tokens per rank that fit for every bucket with full
  recomputation); each sequence's SP size is the next power of two of
  ``ceil(L / C)`` (never below the smallest size its bucket fits on).
- Global batches are the shuffled samples cut at the global-batch bound, in order.
- Group sizes follow each size's share of the workload estimate; sequences go,
  largest workload ``L**2 / sp`` first, to the group of their size (or larger, at
  ``L**2 / size``) with the least estimated work.
- Each group's sequences are packed (no padding) into micro-batches of at most
  ``C * sp`` tokens. One recomputation setting for all (every block).
"""

from __future__ import annotations

import numpy as np

from datacentric.scheduling import balance
from datacentric.scheduling.global_batches import chunk_fixed
from datacentric.scheduling.micro_batches import emit_iteration
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.packed import pack_in_order
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def tokens_per_rank(inp: PolicyInput, table: OptionTable) -> int:
    """The per-rank token limit: every bucket fits this many tokens per rank on some
    SP size within a node."""
    if inp.options.megatron_tokens_per_rank:
        return int(inp.options.megatron_tokens_per_rank)
    limits = []
    for b in inp.active_buckets():
        rep = inp.view.rep_tokens(b)
        per_rank = [
            cfg.max_batch * rep // s
            for s in table.node_sizes
            if (cfg := table.config(b, s)) is not None
        ]
        limits.append(max(per_rank) if per_rank else rep // table.min_sp(b))
    return max(1, min(limits))


def sp_sizes_for(inp: PolicyInput, table: OptionTable, ids: np.ndarray, limit: int) -> np.ndarray:
    """Each sequence's SP size: ``next_pow2(ceil(L / limit))``, at least its bucket's
    smallest feasible size (the whole world when no power of two is left)."""
    need = -(-inp.view.tokens[ids] // limit)
    floor = np.asarray([table.min_sp(int(b)) for b in inp.view.bucket_of[ids]])
    sizes = np.asarray(table.all_sizes)
    at = np.searchsorted(sizes, np.maximum(need, floor))
    return sizes[np.minimum(at, len(sizes) - 1)]


def workload(lengths: np.ndarray, sp: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Megatron's estimate ``L**2 / size`` of each sequence on each group size at or
    above its own SP size (infinite below)."""
    size_row = np.asarray(sizes, dtype=float)[None, :]
    return np.where(size_row >= sp[:, None], lengths[:, None] ** 2 / size_row, np.inf)


def balance_batch(
    world: int, chunk: np.ndarray, sp: np.ndarray, lengths: np.ndarray, base_sizes: list[int]
) -> tuple[list[int], np.ndarray]:
    """Group sizes and the group of every sequence, greedy on the workload estimate."""
    sizes = sorted(set(base_sizes) | set(sp.tolist()))
    own = np.searchsorted(sizes, sp)
    load = np.bincount(own, weights=lengths**2, minlength=len(sizes))
    layout = balance.proportional_layout(world, sizes, load, len(chunk))
    while True:
        sizes = sorted(set(sizes) | set(layout))
        work = workload(lengths, sp, sizes)
        group_class = np.searchsorted(sizes, layout)
        if np.isfinite(work[:, group_class]).any(axis=1).all():
            owner, _ = balance.lpt(work, group_class, sizes)
            if balance.fill_empty(work, group_class, owner):
                return layout, owner
        if layout == [world]:
            raise ValueError(f"megatron-dyncp: cannot cover {world} ranks with this batch")
        layout = balance.merge_groups(world, layout, len(layout) - 1)


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``megatron-dyncp`` policy."""
    world = inp.world_size
    table = inp.full_table()
    limit = tokens_per_rank(inp, table)
    chunks, dropped = chunk_fixed(inp, inp.rng.permutation(inp.active))
    out = PolicyOutput(iterations=[], dropped=dropped)
    for chunk in chunks:
        sp = sp_sizes_for(inp, table, chunk, limit)
        lengths = inp.view.tokens[chunk].astype(float)
        layout, owner = balance_batch(world, chunk, sp, lengths, table.node_sizes)
        groups = []
        for g, s in enumerate(layout):
            members = chunk[owner == g].tolist()
            groups.append((s, pack_in_order(inp, table, members, limit * s, s)))
        out.iterations.append(emit_iteration(len(out.iterations), world, groups, table))
    return out
