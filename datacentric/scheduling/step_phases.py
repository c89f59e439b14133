"""``dcp-opt``'s step of a global batch's micro-batches (:func:`solve_step`): on one
layout, or in two phases one after the other where that is estimated shorter.

The phases: the micro-batches whose cheapest size is the larger first
(:func:`two_phases`), the leftover round of a step where all prefer one size last
(:func:`tail_phase`), or those of half the step's bound first, each on a group of its
own with fillers (:func:`filled_phase`). Each phase is laid out by
:func:`~datacentric.scheduling.layout_search.solve_iteration` on its rows of the
step's time matrix, made once (:func:`node_times`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from datacentric.schedule import Iteration
from datacentric.scheduling.item import Item
from datacentric.scheduling.layout_search import (
    NEIGHBOUR_LIMIT,
    lower_bound,
    preferred_class,
    solve_iteration,
)
from datacentric.scheduling.micro_batches import emit_iteration, place_groups
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import time_matrix
from datacentric.scheduling.policy_input import PolicyInput

#: A step runs in two phases only when that is estimated this much shorter.
PHASE_GAIN = 0.01
#: A tail phase (:func:`tail_phase`) is tried on steps of at most this many micro-batches
#: a group ...
TAIL_ROUNDS = 8
#: ... and kept when estimated this much shorter (relative; Megatron re-forms its layout
#: for every micro-batch, and a peer's step is taken at any gain).
TAIL_GAIN = 1e-9


def solve_step(inp: PolicyInput, table: OptionTable, items: list[Item], k: int) -> Iteration:
    """Step ``k`` of ``items``: on one layout, in :func:`two_phases` where that is at
    least :data:`PHASE_GAIN` shorter, else with a :func:`tail_phase` where shorter."""
    node = node_times(table, items)  # read by each layout tried, made once
    best = emit_iteration(k, inp.world_size, solve_iteration(inp, table, items, node), table)
    phased = two_phases(inp, table, items, k, node)
    if phased is not None and phased.est_makespan_s < best.est_makespan_s * (1 - PHASE_GAIN):
        best = phased
    tail = tail_phase(inp, table, items, k, node) if phased is None else None
    if tail is not None and tail.est_makespan_s < best.est_makespan_s * (1 - TAIL_GAIN):
        best = tail
    filled = filled_phase(inp, table, items, k, node)
    if filled is not None and filled.est_makespan_s < best.est_makespan_s * (1 - TAIL_GAIN):
        best = filled
    return best


def node_times(table: OptionTable, items: list[Item]) -> np.ndarray:
    """``items``' :func:`~datacentric.scheduling.placement.time_matrix` on the sizes
    within a node (``table.node_sizes``), as :func:`solve_iteration`, :func:`two_phases`,
    :func:`tail_phase` and :func:`filled_phase` read it."""
    return time_matrix(table, items, list(table.node_sizes))


def on_sizes(
    table: OptionTable, items: list[Item], sizes: list[int], node: np.ndarray | None
) -> np.ndarray:
    """``items``' time matrix on ``sizes``: the columns of the sizes within a node from
    ``node`` (their :func:`node_times`) where given, the others made here (each column
    is its size's alone)."""
    within = list(table.node_sizes)
    if node is None:
        return time_matrix(table, items, sizes)
    past = [s for s in sizes if s not in within]
    more = time_matrix(table, items, past)
    columns = [node[:, within.index(s)] if s in within else more[:, past.index(s)] for s in sizes]
    return np.column_stack(columns) if columns else np.zeros((len(items), 0))


def two_phases(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases, or None where it does not apply: first the micro-batches
    whose cheapest size is at least a threshold, then the rest, each phase laid out and
    assigned by :func:`solve_iteration`; the shorter of two thresholds is kept:

    - the second smallest cheapest size present (above one GPU when some micro-batch
      prefers one: a long video on two GPUs);
    - the largest (a 1M-token document on 128 GPUs while the rest wait), solved without
      the exact solver (on longctx-1m at 256 GPUs its node-limited search took 0.17 s per
      phase and gained 0.5% of the epoch).

    One layout keeps groups of the large size open for the whole step, running short
    micro-batches at their cost there; two phases let the short ones run on the small
    sizes after the long ones. Tried on steps of at most :data:`NEIGHBOUR_LIMIT`
    micro-batches. ``node``: the micro-batches' :func:`node_times`, when made already."""
    if len(items) > NEIGHBOUR_LIMIT:
        return None
    sizes = list(table.node_sizes)
    pref = preferred_class(on_sizes(table, items, sizes, node), sizes)
    present = sorted(set(pref.tolist()))
    if len(present) < 2:
        return None
    best: Iteration | None = None
    for threshold, exact_solver in ((present[1], True), (present[-1], False)):
        if not exact_solver and threshold == present[1]:
            continue  # the same split as the first
        large, small = np.flatnonzero(pref >= threshold), np.flatnonzero(pref < threshold)
        phased = _in_phases(inp, table, items, (large, small), k, node, exact_solver)
        if phased is not None and (best is None or phased.est_makespan_s < best.est_makespan_s):
            best = phased
    return best


def tail_phase(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases when every micro-batch prefers one size and a few of
    them are left over once each group of that size holds as many (25 documents of
    164K tokens on four groups of 16 ranks): the longest whole rounds first, the
    remainder after them, solved on its own (the whole world for one document, as
    Megatron's last micro-batch runs it). None where that does not apply: more than
    :data:`TAIL_ROUNDS` micro-batches a group, or no remainder. ``node``: the
    micro-batches' :func:`node_times`, when made already."""
    if len(items) > TAIL_ROUNDS * inp.world_size:
        return None
    top = inp.options.max_sp_size or inp.world_size
    sizes = [s for s in table.all_sizes if s <= top]
    times = on_sizes(table, items, sizes, node)
    gpu = times * np.asarray(sizes, dtype=float)
    if not np.isfinite(gpu).any(axis=1).all():
        return None
    pref = np.argmin(gpu, axis=1)
    if len(set(pref.tolist())) != 1:
        return None
    groups = inp.world_size // sizes[int(pref[0])]
    rest = len(items) % groups if groups > 1 else 0
    if rest == 0 or len(items) > TAIL_ROUNDS * groups:
        return None
    order = np.argsort(-times[np.arange(len(items)), pref], kind="stable").tolist()
    cut = len(items) - rest
    return _in_phases(inp, table, items, (order[:cut], order[cut:]), k, node)


def filled_phase(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases where some micro-batches take more than half the step's
    bound on their cheapest size within a node (a 432K-token clip on 2 H100s: 6.13 s of
    a 12.1 s step; with 13 of them one layout puts two on a pair of GPUs): first the
    longest of them, each on a group of its cheapest size, as many as the world holds
    at once, with the longest other micro-batches filling the ranks left for as long;
    then the rest, each phase solved by :func:`solve_iteration`. None where no
    micro-batch is that long, or on steps of more than :data:`NEIGHBOUR_LIMIT`.
    ``node``: the micro-batches' :func:`node_times`, when made already."""
    if len(items) > NEIGHBOUR_LIMIT:
        return None
    sizes = list(table.node_sizes)
    times = on_sizes(table, items, sizes, node)
    gpu = times * np.asarray(sizes, dtype=float)
    if not np.isfinite(gpu).any(axis=1).all():
        return None
    pref = np.argmin(gpu, axis=1)
    own = times[np.arange(len(items)), pref]
    ranks = np.asarray(sizes)[pref]
    big = own > lower_bound(times, sizes, inp.world_size) / 2
    order = np.argsort(-own, kind="stable").tolist()
    first, left = [], inp.world_size
    for j in order:
        if big[j] and ranks[j] <= left:
            first.append(j)
            left -= int(ranks[j])
    if not first:
        return None
    span, room = float(own[first].max()), left * float(own[first].max())
    chosen = set(first)
    for j in order:  # fillers: the longest that fit the ranks left, for as long
        if j not in chosen and own[j] <= span and gpu[j, pref[j]] <= room:
            first.append(j)
            room -= float(gpu[j, pref[j]])
    chosen = set(first)
    rest = [j for j in range(len(items)) if j not in chosen]
    if not rest:
        return None
    return _in_phases(inp, table, items, (first, rest), k, node)


def _in_phases(
    inp: PolicyInput,
    table: OptionTable,
    items: list[Item],
    parts: tuple[Sequence[int], ...],
    k: int,
    node: np.ndarray | None,
    exact_solver: bool = True,
) -> Iteration | None:
    """Step ``k`` with the ``items`` of each of ``parts`` (their positions) run one
    phase after another (None where a phase has too few micro-batches to cover the
    world), each phase solved on its rows of ``node`` (the items' :func:`node_times`,
    when made already: not made again per phase); ``exact_solver=False`` solves the
    phases by the heuristics alone."""
    if not exact_solver:
        inp = replace(inp, options=replace(inp.options, exact_solver=False))
    groups, placed = [], []
    for phase, rows in enumerate(parts):
        part = [items[j] for j in rows]
        times = None if node is None else node[np.asarray(rows, dtype=np.int64)]
        try:
            solved = solve_iteration(inp, table, part, times)
        except ValueError:  # too few micro-batches in a phase to cover the world
            return None
        starts = place_groups(inp.world_size, [sp for sp, _ in solved])
        groups += solved
        placed += [(start, phase) for start in starts]
    return emit_iteration(k, inp.world_size, groups, table, placed=placed)
