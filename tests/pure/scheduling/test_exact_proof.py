"""The proof that lets dcp-opt skip HiGHS (:func:`exact.cannot_improve`) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from datacentric.scheduling import exact


def best_makespan(tg: np.ndarray) -> float:
    """The least makespan over every assignment that runs something on every group."""
    n_items, n_groups = tg.shape
    best = np.inf
    for owner in itertools.product(range(n_groups), repeat=n_items):
        owner = np.asarray(owner)
        if len(np.unique(owner)) < n_groups:
            continue
        own = tg[np.arange(n_items), owner]
        if np.isfinite(own).all():
            best = min(best, float(np.bincount(owner, weights=own, minlength=n_groups).max()))
    return best


def random_instance(rng: np.random.Generator) -> np.ndarray:
    """Items on groups of two or three sizes (identical columns per size), some not fitting."""
    n_items, n_groups = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    kinds = rng.integers(0, 2, size=n_groups)
    base = rng.uniform(0.2, 2.0, size=(n_items, 2))
    base[:, 1] = base[:, 0] * rng.uniform(0.45, 0.7, size=n_items)
    base[rng.random(size=base.shape) < 0.1] = np.inf
    return base[:, kinds]


def test_a_proof_holds_and_a_better_assignment_is_never_ruled_out() -> None:
    rng = np.random.default_rng(0)
    proved = found = 0
    for _ in range(150):
        tg = random_instance(rng)
        best = best_makespan(tg)
        if not np.isfinite(best):
            continue
        # the optimum itself: nothing is better (every such small case is proved)
        proved += exact.cannot_improve(tg, best)
        # a start above the optimum: a better assignment exists, never "proved"
        worse = best * 1.01 + 1e-9
        assert not exact.cannot_improve(tg, worse)
        found += 1
    assert proved == found > 80


def test_a_start_a_rounding_error_above_the_optimum_is_not_proved_optimal() -> None:
    tg = np.array([[1.0, 1.0], [0.7, 0.7], [0.3, 0.3]])
    assert exact.cannot_improve(tg, 1.0)
    # 1.0 + 2e-12: the optimum (1.0) is better by more than GAIN_S
    assert not exact.cannot_improve(tg, 1.0 + 2 * exact.GAIN_S)


def test_the_search_gives_up_rather_than_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    tg = rng.uniform(1.0, 2.0, size=(7, 1))[:, [0, 0, 0]]
    best = best_makespan(tg)
    assert exact.cannot_improve(tg, best)
    monkeypatch.setattr(exact, "PROOF_NODES", 2)
    assert not exact.cannot_improve(tg, best)  # not proved within the limit: HiGHS decides


@pytest.mark.skipif(not exact.available(), reason="HiGHS not installed")
def test_highs_runs_only_where_the_start_is_not_proved_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    times = np.array([[1.0, 0.6], [0.9, 0.5], [0.8, 0.45], [0.4, 0.25]])
    group_class = np.array([0, 1])
    start = np.array([0, 1, 1, 0])  # loads 1.4 and 0.95; 0.6 + 0.5 + 0.25 = 1.35 is better
    better = exact.solve_assignment(times, group_class, start, max_nodes=200)
    assert better is not None
    optimum = better

    def no_highs() -> None:
        raise AssertionError("HiGHS was asked although the start is proved best")

    monkeypatch.setattr(exact.highspy, "Highs", no_highs)
    assert exact.solve_assignment(times, group_class, optimum, max_nodes=200) is None
