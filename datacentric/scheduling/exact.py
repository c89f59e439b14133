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
"""

from __future__ import annotations

import contextlib
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
    """Improve the assignment ``start`` (group of every item); None if HiGHS found
    nothing better or is not installed."""
    if highspy is None:
        return None
    n_items, n_groups = len(times), len(group_class)
    tg = times[:, group_class]  # (items, groups)
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
    t_own = tg[np.arange(n_items), start]
    before = float(np.bincount(start, weights=t_own, minlength=n_groups).max())
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
    return chosen if after < before - 1e-12 else None
