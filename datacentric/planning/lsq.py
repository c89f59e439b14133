"""Bounded linear least squares for the few-column fits of calibration and fitted models."""

from __future__ import annotations

import numpy as np

#: Relative size below which a dual value counts as zero (the active-set loop's tolerance).
_DUAL_TOL = 1e-12


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin ||a x - b||`` subject to ``x >= 0`` (Lawson and Hanson's active-set method,
    "Solving Least Squares Problems", 1974, chapter 23).

    Exact up to rounding: it stops when every coefficient at 0 has a non-positive
    gradient (the optimality conditions), after at most a few passes per column. Columns
    that are all zero stay at 0.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    columns = a.shape[1]
    x = np.zeros(columns)
    free = np.zeros(columns, dtype=bool)  # the passive set: coefficients not held at 0
    size = float(np.abs(a).max(initial=0.0)) * float(np.abs(b).max(initial=0.0))
    tol = _DUAL_TOL * max(1.0, size)
    for _ in range(3 * columns + 3):
        dual = a.T @ (b - a @ x)
        candidates = np.flatnonzero(~free & (dual > tol))
        if candidates.size == 0:
            break
        free[candidates[np.argmax(dual[candidates])]] = True
        while True:
            z = np.zeros(columns)
            z[free], *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if np.all(z[free] > 0):
                x = z
                break
            # step from x toward z until the first free coefficient reaches 0
            blocked = np.flatnonzero(free & (z <= 0))
            steps = x[blocked] / (x[blocked] - z[blocked])
            x = x + steps.min() * (z - x)
            x[blocked[np.argmin(steps)]] = 0.0  # exactly at its bound, not a rounding off it
            free &= x > 0
            x[~free] = 0.0
    return x


def bounded_least_squares(a: np.ndarray, b: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """``argmin ||a x - b||`` subject to ``x >= lower`` (shifted to a non-negative problem:
    ``x = lower + y``, ``y >= 0``)."""
    lower = np.asarray(lower, dtype=float)
    return lower + nonnegative_least_squares(a, np.asarray(b, dtype=float) - a @ lower)
