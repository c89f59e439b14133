"""The PAC knapsack is exact: it equals brute force over every subset of blocks."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from datacentric.planning.planner import (
    choose_recompute,
    knapsack_counts,
    recompute_from_counts,
)
from datacentric.shapes import SampleShape


def brute_force(values, costs, limits, capacity) -> float:
    """Best value over every subset of individual items (not counts)."""
    items = [(v, c) for v, c, n in zip(values, costs, limits) for _ in range(n)]
    best = 0.0
    for mask in itertools.product((0, 1), repeat=len(items)):
        cost = sum(c for (v, c), m in zip(items, mask) if m)
        if cost <= capacity:
            best = max(best, sum(v for (v, c), m in zip(items, mask) if m))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_knapsack_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    groups = rng.randint(1, 4)
    limits = [rng.randint(0, 4) for _ in range(groups)]
    values = [rng.uniform(0.0, 5.0) for _ in range(groups)]
    costs = [rng.randint(1, 10**9) for _ in range(groups)]  # bytes, no rounding
    capacity = rng.randint(0, sum(c * n for c, n in zip(costs, limits)) + 1)
    result = knapsack_counts(values, costs, limits, capacity)
    assert result.cost <= capacity
    assert all(0 <= k <= n for k, n in zip(result.counts, limits))
    assert result.value == pytest.approx(sum(k * v for k, v in zip(result.counts, values)))
    assert result.value == pytest.approx(brute_force(values, costs, limits, capacity))


def test_knapsack_respects_exact_bytes() -> None:
    # one byte short of two items: only one fits (whole-GB rounding would take both or none)
    result = knapsack_counts([1.0], [2**30 + 1], [2], 2 * (2**30 + 1) - 1)
    assert result.counts == (1,)


def test_recompute_from_counts_keeps_last_blocks_of_each_kind() -> None:
    kinds = ("spatial", "temporal") * 3
    flags = recompute_from_counts(kinds, {"spatial": 1, "temporal": 2})
    assert flags == (True, True, True, False, False, False)


class AdditiveModel:
    """A toy cost model: per-kind additive time and memory plus a recompute transient."""

    def __init__(self, kinds: Sequence[str], rng: random.Random) -> None:
        self.block_kinds = tuple(kinds)
        distinct = sorted(set(kinds))
        self.fwd = {k: rng.uniform(0.1, 1.0) for k in distinct}
        self.act = {k: rng.randint(10, 1000) for k in distinct}
        self.transient = rng.randint(0, 500)

    num_blocks = property(lambda self: len(self.block_kinds))
    gpus_per_node = 8

    def pass_time_s(self, shapes, sp_size, recompute) -> float:
        n = len(shapes)
        return sum(n * self.fwd[k] * (4 if r else 3) for k, r in zip(self.block_kinds, recompute))

    def pass_memory_bytes(self, shapes, sp_size, recompute) -> int:
        n = len(shapes)
        kept = sum(n * self.act[k] for k, r in zip(self.block_kinds, recompute) if not r)
        inputs = sum(n for r in recompute if r)
        peak = self.transient if any(recompute) else 0
        return 1000 + kept + inputs + peak

    def grad_sync_time_s(self, world_size: int) -> float:
        return 0.0


@pytest.mark.parametrize("seed", range(30))
def test_choose_recompute_equals_brute_force_over_block_subsets(seed: int) -> None:
    rng = random.Random(seed)
    kinds = [rng.choice("ab") for _ in range(rng.randint(1, 8))]
    model = AdditiveModel(kinds, rng)
    shapes = [SampleShape.text(16)] * rng.randint(1, 3)
    full = (True,) * len(kinds)
    low = model.pass_memory_bytes(shapes, 1, full)
    high = model.pass_memory_bytes(shapes, 1, (False,) * len(kinds))
    cap = rng.randint(min(low, high) - 10, max(low, high) + 10)
    choice = choose_recompute(model, shapes, 1, cap)
    feasible = [
        model.pass_time_s(shapes, 1, flags)
        for flags in itertools.product((True, False), repeat=len(kinds))
        if model.pass_memory_bytes(shapes, 1, flags) <= cap
    ]
    if not feasible:
        assert choice is None
        return
    assert choice is not None
    assert choice.memory_bytes <= cap
    assert choice.memory_bytes == model.pass_memory_bytes(shapes, 1, choice.recompute)
    assert choice.time_s == pytest.approx(min(feasible))
