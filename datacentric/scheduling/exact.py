"""Exact assignment of micro-batches to a fixed set of groups with HiGHS (MILP).

Variables ``x[j, g]`` (item ``j`` runs on group ``g``; only pairs where it fits)
and the makespan ``M``::

    minimise M
    subject to  sum_g x[j, g] = 1              every item exactly once
                sum_j t[j, g] x[j, g] <= M     every group within the makespan
                sum_j x[j, g] >= 1             every group runs something
                x binary

Started from the heuristic's assignment; stopped by a branch-and-bound *node*
limit (never a time limit: a time limit would let ranks of different speed reach
different schedules), single-threaded, fixed random seed, so every rank computes
the same answer with the same HiGHS version.

HiGHS is not called when a small depth-first search proves first that no assignment
beats the start (:func:`cannot_improve`): its answer would be None, and on the
heuristic's usual steps the proof takes milliseconds where HiGHS takes a few tenths
of a second.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import numpy as np

try:  # optional dependency (the ``opt`` extra)
    import highspy
except ImportError:  # pragma: no cover - exercised only without highspy
    highspy = None


def available() -> bool:
    """Whether HiGHS can be used."""
    return highspy is not None


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1: HiGHS prints its banner from C on first use, which
    would corrupt a command's JSON output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve_assignment(
    times: np.ndarray, group_class: np.ndarray, start: np.ndarray, *, max_nodes: int
) -> np.ndarray | None:
    """Improve the assignment ``start`` (group of every item); None if there is nothing
    better (proved, or HiGHS found nothing) or HiGHS is not installed."""
    if highspy is None:
        return None
    n_items, n_groups = len(times), len(group_class)
    tg = times[:, group_class]  # (items, groups)
    t_own = tg[np.arange(n_items), start]
    before = float(np.bincount(start, weights=t_own, minlength=n_groups).max())
    if cannot_improve(tg, before):
        return None
    pairs_j, pairs_g = np.nonzero(np.isfinite(tg))
    n_x = len(pairs_j)
    t_pairs = tg[pairs_j, pairs_g]
    # Columns: x pairs then M. Rows: items (=1), groups time (<=0), groups count (>=1).
    starts, index, value = [], [], []
    for c in range(n_x):
        starts.append(len(index))
        index += [int(pairs_j[c]), n_items + int(pairs_g[c]), n_items + n_groups + int(pairs_g[c])]
        value += [1.0, float(t_pairs[c]), 1.0]
    starts.append(len(index))
    index += [n_items + g for g in range(n_groups)]
    value += [-1.0] * n_groups
    starts.append(len(index))

    lp = highspy.HighsLp()
    lp.num_col_ = n_x + 1
    lp.num_row_ = n_items + 2 * n_groups
    lp.col_cost_ = np.r_[np.zeros(n_x), 1.0]
    lp.col_lower_ = np.zeros(n_x + 1)
    lp.col_upper_ = np.r_[np.ones(n_x), highspy.kHighsInf]
    lp.row_lower_ = np.r_[
        np.ones(n_items), np.full(n_groups, -highspy.kHighsInf), np.ones(n_groups)
    ]
    lp.row_upper_ = np.r_[
        np.ones(n_items), np.zeros(n_groups), np.full(n_groups, highspy.kHighsInf)
    ]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n_x + [highspy.HighsVarType.kContinuous]

    with _quiet_stdout():
        h = highspy.Highs()
    for name, val in (
        ("output_flag", False),
        ("threads", 1),
        ("random_seed", 0),
        ("mip_max_nodes", int(max_nodes)),
        ("mip_rel_gap", 1e-3),
    ):
        h.setOptionValue(name, val)
    h.passModel(lp)
    chosen = pairs_g[:0]
    incumbent = np.zeros(n_x + 1)
    pos = {(int(j), int(g)): c for c, (j, g) in enumerate(zip(pairs_j, pairs_g))}
    for j, g in enumerate(start):
        incumbent[pos[(j, int(g))]] = 1.0
    incumbent[-1] = before
    sol = highspy.HighsSolution()
    sol.col_value = list(incumbent)
    h.setSolution(sol)
    h.run()
    values = np.asarray(h.getSolution().col_value)
    if len(values) != n_x + 1 or not np.isfinite(values).all():
        return None
    x = values[:n_x] > 0.5
    chosen = np.full(n_items, -1)
    chosen[pairs_j[x]] = pairs_g[x]
    if (chosen < 0).any() or np.bincount(pairs_j[x], minlength=n_items).max() != 1:
        return None
    if np.bincount(chosen, minlength=n_groups).min() < 1:
        return None
    after = float(np.bincount(chosen, weights=tg[np.arange(n_items), chosen]).max())
    return chosen if after < before - GAIN_S else None


#: Most search nodes :func:`cannot_improve` visits before leaving the question to HiGHS.
PROOF_NODES = 20_000
#: Most items it searches over (one level of recursion each).
PROOF_ITEMS = 256
#: What :func:`solve_assignment` counts as better: a makespan this much (seconds) lower.
GAIN_S = 1e-12


def cannot_improve(tg: np.ndarray, before: float) -> bool:
    """Whether no assignment (every item once, on a group where its time ``tg[j, g]`` is
    finite, every group running something) has every group's load below
    ``before - GAIN_S``: True only when proved, False when one exists or the search
    stops at :data:`PROOF_NODES`.

    Depth first, items longest first; groups of one size with equal loads are tried
    once; a branch ends when an item finishes at or past the cap, when fewer items are
    left than empty groups, or when the items left need more weighted time than the
    groups have room (each item's least ``t[j, g] * w[g]`` against ``sum (cap -
    load[g]) * w[g]``, for any positive ``w``: one over each group's mean time). The
    cap is raised by twice a bound on the rounding of a float sum of ``n`` times, so no
    assignment whose loads, summed in any order, fall below ``before - GAIN_S`` is cut.
    """
    n_items, n_groups = tg.shape
    slack = n_items * 2.0**-52 * before  # rounding of one load, summed in any order
    if n_items > PROOF_ITEMS or not 3 * slack < GAIN_S or not math.isfinite(before):
        return False
    cap = before - GAIN_S + 2 * slack
    finite = np.isfinite(tg)
    kind = np.unique(tg.T, axis=0, return_inverse=True)[1].reshape(-1).tolist()
    weight = [
        1.0 / float(tg[finite[:, g], g].mean()) if finite[:, g].any() else 1.0
        for g in range(n_groups)
    ]
    order = np.argsort(-np.where(finite, tg, np.inf).min(axis=1), kind="stable").tolist()
    rows = [[t if math.isfinite(t) else math.inf for t in tg[j].tolist()] for j in order]
    need = [min((t * w for t, w in zip(row, weight) if t != math.inf), default=0.0) for row in rows]
    left = [0.0] * (n_items + 1)  # weighted time of the items from i on
    for i in range(n_items - 1, -1, -1):
        left[i] = left[i + 1] + need[i]
    loads, counts = [0.0] * n_groups, [0] * n_groups
    nodes = 0

    def below_cap(i: int, empty: int) -> bool | None:
        """Whether items ``i:`` complete an assignment below the cap (None: gave up)."""
        nonlocal nodes
        nodes += 1
        if nodes > PROOF_NODES:
            return None
        if empty > n_items - i:
            return False
        if i == n_items:
            return True
        room = sum((cap + slack - load) * w for load, w in zip(loads, weight))
        if left[i] > room * (1 + 1e-9):
            return False
        tried = set()
        for g, t in enumerate(rows[i]):
            state = (kind[g], loads[g], counts[g] > 0)
            if t == math.inf or state in tried or loads[g] + t >= cap:
                continue
            tried.add(state)
            loads[g] += t
            counts[g] += 1
            found = below_cap(i + 1, empty - (counts[g] == 1))
            counts[g] -= 1
            loads[g] = state[1]
            if found is not False:
                return found
        return False

    return below_cap(0, n_groups) is False
