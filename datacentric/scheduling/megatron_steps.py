"""``megatron-dyncp``'s steps under one per-rank token cap and recomputation table.

A step is Megatron's micro-batches (formed by
:mod:`~datacentric.scheduling.megatron_groups`), each one phase of the step, whose CP
groups run their packed sequences (:func:`build_step`); where the model cannot run
those groups at their size, or they cannot cover the ranks, the step runs on one layout
(:func:`one_layout`). The CP sizes the groups may take are those the model runs with
some split, up to ``--max-sp-size`` (:func:`cp_sizes`, :func:`cp_limits`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datacentric.planning.bucket_options import split_candidates
from datacentric.planning.heads import mixable_sp_sizes
from datacentric.schedule import Iteration
from datacentric.scheduling.global_batches import GroupCap
from datacentric.scheduling.megatron_groups import (
    CPGroup,
    NoLayoutError,
    cp_min,
    megatron_micro_batches,
)
from datacentric.scheduling.micro_batches import emit_iteration
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.packed import fitting_items
from datacentric.scheduling.placement import place_at_sizes
from datacentric.scheduling.policy_input import PolicyInput


def cp_sizes(inp: PolicyInput) -> list[int]:
    """The CP sizes Megatron's groups may take here: powers of two dividing the world,
    and the whole world (one group of every rank), up to ``--max-sp-size`` (default: the
    world), that the model runs with some split
    (:func:`~datacentric.planning.bucket_options.split_candidates`: past the head count
    on a ring, as Megatron's ``a2a+p2p`` context parallelism runs)."""
    return _runnable_cp_sizes(inp, inp.options.max_sp_size or inp.world_size)


def _runnable_cp_sizes(inp: PolicyInput, top: int) -> list[int]:
    """The CP sizes of :func:`cp_sizes` up to ``top`` ranks, whatever ``--max-sp-size`` says."""
    sizes = [s for s in mixable_sp_sizes(inp.world_size) if s <= top]
    return [s for s in sizes if split_candidates(inp.cost_model, s)] or [1]


def _group_cap(inp: PolicyInput) -> GroupCap:
    """Where the limit of :func:`cp_limits` comes from: ``--max-sp-size`` when it is below
    the largest CP size the model runs here, else the model."""
    return GroupCap.of(inp.options, inp.world_size, _runnable_cp_sizes(inp, inp.world_size)[-1])


def cp_limits(inp: PolicyInput) -> tuple[int, bool]:
    """The largest power-of-two CP size of :func:`cp_sizes` and whether one group of
    every rank runs beyond it (a world that is not a power of two, such as 6)."""
    sizes = cp_sizes(inp)
    nested = [s for s in sizes if s & (s - 1) == 0]
    return nested[-1], sizes[-1] != nested[-1]


def build_steps(
    inp: PolicyInput,
    table: OptionTable,
    cap: int,
    chunks: list[np.ndarray],
    first: int = 0,
    formed: dict[tuple[int, int], list[list[CPGroup]] | None] | None = None,
    told: Callable[[int], None] | None = None,
    built: dict[int, Iteration] | None = None,
) -> list[Iteration]:
    """The iterations of ``chunks`` (steps ``first``, ``first + 1``, ...) under ``cap``.
    ``formed``: Megatron's micro-batches per (step, cap), kept across calls (they do not
    depend on the recomputation, so a search forms them once per cap). ``told(k)``:
    step ``k`` is built. ``built``: steps built already under the same table and cap,
    by step (taken from it, not built again)."""
    formed = {} if formed is None else formed
    built = {} if built is None else built
    out = []
    for k, chunk in enumerate(chunks, start=first):
        out.append(built.pop(k) if k in built else build_step(inp, table, cap, k, chunk, formed))
        if told is not None:
            told(k)
    return out


def build_step(
    inp: PolicyInput,
    table: OptionTable,
    cap: int,
    k: int,
    chunk: np.ndarray,
    formed: dict[tuple[int, int], list[list[CPGroup]] | None],
) -> Iteration:
    """Step ``k`` (its samples ``chunk``) under ``cap``: Megatron's micro-batches (formed
    once per (step, cap) into ``formed``), else one layout (:func:`one_layout`)."""
    world = inp.world_size
    lengths = list(zip(chunk.tolist(), inp.view.tokens[chunk].tolist()))
    if (k, cap) not in formed:
        max_cp, whole = cp_limits(inp)
        try:
            formed[k, cap] = megatron_micro_batches(
                lengths, cap, world, max_cp, whole, _group_cap(inp)
            )
        except NoLayoutError:
            formed[k, cap] = None
    phases = formed[k, cap]
    if phases is not None:
        groups, placed = [], []
        for phase, micro_batch in enumerate(phases):
            for g in micro_batch:
                groups.append((g.size, fitting_items(table, g.ids, g.size)))
                placed.append((g.first, phase))
        runnable = all(
            table.config(item.bucket, sp) is not None for sp, items in groups for item in items
        )
        if runnable:
            return emit_iteration(k, world, groups, table, placed=placed)
    return one_layout(inp, table, k, lengths, cap, cp_sizes(inp))


def one_layout(
    inp: PolicyInput,
    table: OptionTable,
    k: int,
    lengths: list[tuple[int, int]],
    cap: int,
    runnable: list[int],
) -> Iteration:
    """Step ``k`` on one layout: each sequence packed as Megatron would at its CP size
    (the smallest of ``runnable`` holding it, else the largest), each unit on the
    smallest size at least that where it runs, placed as ``dcp-inter`` places its
    micro-batches."""
    world = inp.world_size
    max_cp = runnable[-1]
    by_size: dict[int, list[int]] = {}
    for sid, length in sorted(lengths, key=lambda x: -x[1]):
        c = cp_min(length, cap)
        by_size.setdefault(next((s for s in runnable if s >= c), max_cp), []).append(sid)
    items, own = [], []
    for c, ids in sorted(by_size.items()):
        per_group = max(1, int(cap * c))
        batch: list[int] = []
        tokens = 0
        for sid in [*ids, None]:
            length = 0 if sid is None else int(inp.view.tokens[sid])
            if batch and (sid is None or tokens + length > per_group):
                for item in fitting_items(table, batch, c):
                    sizes = [
                        s for s in runnable if s >= c and np.isfinite(table.item_time(item, s))
                    ]
                    sizes = sizes or [s for s in runnable if np.isfinite(table.item_time(item, s))]
                    if not sizes:
                        bucket = inp.view.buckets[item.bucket].name
                        raise ValueError(
                            f"megatron-dyncp: step {k}: a micro-batch of bucket {bucket!r} "
                            f"fits no SP size up to {max_cp}"
                        )
                    items.append(item)
                    own.append(sizes[0])
                batch, tokens = [], 0
            if sid is not None:
                batch.append(sid)
                tokens += length
    groups = place_at_sizes(items, own, table, world, inp.options.local_search_moves)
    return emit_iteration(k, world, groups, table)
