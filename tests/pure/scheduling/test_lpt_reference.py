"""``balance.lpt`` against a plain reading of its rule, item by item and group by group:
the heaps of each size class, the lists and the names bound once place every item where
the rule says, with and without a target makespan, on random steps with equal times,
sizes an item cannot run on and classes no group has."""

from __future__ import annotations

import math

import numpy as np
import pytest

from datacentric.scheduling import balance


def _reference(times, group_class, class_sizes, target):
    """Longest first (by best time, stable), each item to the group where it finishes
    earliest (fewer GPU-seconds, then the lower class, the less loaded and the lower
    group among equals), or with ``target`` to the one costing the fewest GPU-seconds
    among those where it finishes within it, when there is one."""
    loads = [0.0] * len(group_class)
    owner = [-1] * len(times)
    for j in np.argsort(-times.min(axis=1), kind="stable").tolist():
        ranked = []
        for g, k in enumerate(group_class.tolist()):
            t = float(times[j, k])
            if t == math.inf:
                continue
            finish, cost = loads[g] + t, class_sizes[k] * t
            within = target is not None and finish <= target
            first = (cost, finish) if within else (finish, cost)
            ranked.append((not within, *first, k, loads[g], g, finish))
        if not ranked:
            raise ValueError(f"item {j} fits no group of this layout")
        *_, g, finish = min(ranked)
        loads[g], owner[j] = finish, g
    return np.array(owner), np.array(loads)


@pytest.mark.parametrize("seed", range(6))
def test_lpt_places_each_item_as_its_rule_says(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n_items, n_classes = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        class_sizes = [1, 2, 4, 8][:n_classes]
        times = rng.uniform(0.2, 3.0, size=(n_items, 1)) / np.array(class_sizes) ** 0.8
        times = np.round(times * rng.uniform(0.9, 1.1, size=times.shape), 1)  # equal times
        times[rng.random(times.shape) < 0.15] = np.inf  # sizes an item cannot run on
        group_class = np.sort(rng.integers(0, n_classes, size=int(rng.integers(1, 9))))
        first = times[:, group_class[0]]  # every item runs on the first group's size
        times[:, group_class[0]] = np.where(np.isfinite(first), first, 2.5)
        for target in (None, float(rng.uniform(0.5, 6.0))):
            owner, loads = balance.lpt(times, group_class, class_sizes, target=target)
            want_owner, want_loads = _reference(times, group_class, class_sizes, target)
            assert owner.dtype == np.int64 and loads.dtype == np.float64
            assert owner.tolist() == want_owner.tolist()
            assert loads.tolist() == want_loads.tolist()


def test_an_item_that_fits_no_group_is_refused() -> None:
    times = np.array([[1.0, math.inf], [math.inf, 2.0]])
    with pytest.raises(ValueError, match="item 1 fits no group"):
        balance.lpt(times, np.array([0, 0]), [1, 2])
