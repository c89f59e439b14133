"""Non-negative least squares for the few-column fits of calibration and fitted models."""

from __future__ import annotations

import itertools

import numpy as np


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin ||a x - b||`` subject to ``x >= 0``, exactly, for up to ~10 columns.

    The optimum is the unconstrained least-squares solution on some subset of columns
    (the others at 0); this tries every subset and keeps the best feasible one, which is
    exact and cheap for the handful of features used here (2^columns small solves).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    columns = a.shape[1]
    if columns > 12:
        raise ValueError(f"{columns} columns: exhaustive NNLS is meant for a few features")
    best = np.zeros(columns)
    best_residual = float(np.sum(b**2))
    for size in range(1, columns + 1):
        for subset in itertools.combinations(range(columns), size):
            cols = list(subset)
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            residual = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if residual < best_residual - 1e-15 * max(best_residual, 1.0):
                best_residual = residual
                best = np.zeros(columns)
                best[cols] = sol
    return best
