"""The floor's contract, for every cost model class and wrapper: a pass's time and
memory are never below its ``pass_floor``, and the floor is superadditive over samples
(what :func:`~datacentric.planning.proved_price.proved_prices` proves the bound from).
A model offers a floor or none; a wrapper that changes prices without its own floor
offers none."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_planning_fitted import fitted

from datacentric.planning.bucket_options import accepted_splits
from datacentric.planning.cost_model import CachedCostModel, WrappedCostModel, split_breakdown
from datacentric.planning.forward_only import ForwardOnlyCostModel
from datacentric.planning.proved_price import has_floor
from datacentric.planning.split_modes import SPLIT_MODES, SplitLimitedCostModel
from datacentric.profiling.factory import analytic_cost_model
from datacentric.shapes import SampleShape


def _floor(cost, shapes, sp, flags, ring, linear=False):
    if ring == 1:
        return cost.pass_floor(shapes, sp, flags)
    return cost.pass_floor(shapes, sp, flags, ring_size=ring, ring_linear=linear)


def contract_violations(cost, shapes, sizes, rng, trials=120) -> list[str]:
    """Random micro-batches of ``shapes`` on random SP sizes of ``sizes``, splits the
    model runs and recomputation flags: each broken promise of ``cost``'s floor."""
    configs = [(sp, ring) for sp in sizes for ring in accepted_splits(cost, sp)]
    broken = []
    for _ in range(trials):
        sp, ring = configs[rng.integers(len(configs))]
        flags = tuple(bool(x) for x in rng.integers(2, size=cost.num_blocks))
        batch = [shapes[i] for i in rng.integers(len(shapes), size=rng.integers(1, 6))]
        real = split_breakdown(cost, batch, sp, flags, ring)
        at = f"{len(batch)} samples on SP {sp}, ring {ring}, {sum(flags)} recomputed"
        for linear in (False, True) if ring > 1 else (False,):
            secs, byts = _floor(cost, batch, sp, flags, ring, linear)
            if real.time_s < secs * (1 - 1e-12):
                broken.append(f"time {real.time_s} below the floor {secs}: {at}")
            if real.memory_bytes < byts * (1 - 1e-12):
                broken.append(f"memory {real.memory_bytes} below the floor {byts}: {at}")
            fixed_s, fixed_b = _floor(cost, (), sp, flags, ring, linear)
            singles = [_floor(cost, (s,), sp, flags, ring, linear) for s in batch]
            if fixed_s < 0 or fixed_b < 0 or any(b < fixed_b for _, b in singles):
                broken.append(f"a negative term: {at}")
            if not linear and any(s < fixed_s for s, _ in singles):
                broken.append(f"a sample's seconds below the fixed costs: {at}")
            joined = sum(s - fixed_s for s, _ in singles)
            if secs - fixed_s < joined - 1e-9 * abs(joined):
                broken.append(f"seconds not superadditive: {at}")
            if byts - fixed_b < sum(b - fixed_b for _, b in singles) - len(batch):
                broken.append(f"bytes not superadditive: {at}")
    return broken


def _llama():
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def _stdit():
    return analytic_cost_model("stdit-1.1b", "h100-sxm", world_size=32)


TEXT = [SampleShape.text(n) for n in (16, 700, 4096, 30_000, 91_000, 200_000)]
VIDEO = [SampleShape.video(f, h, w) for f, h, w in [(1, 18, 32), (30, 30, 53), (15, 45, 80)]]
#: name -> (cost model, shapes, SP sizes): every class and wrapper of the package.
MODELS = {
    "analytic text": (_llama, TEXT, [1, 2, 4, 8, 16, 64]),
    "analytic video": (_stdit, VIDEO, [1, 2, 4]),
    "fitted": (fitted, TEXT[:4], [1, 2]),
    **{
        f"split-limited {mode}": (
            lambda mode=mode: SplitLimitedCostModel(_llama(), mode),
            TEXT,
            [1, 2, 8, 16, 64],
        )
        for mode in SPLIT_MODES
    },
    "forward-only text": (lambda: ForwardOnlyCostModel(_llama()), TEXT, [1, 2, 4, 8, 16, 64]),
    "forward-only ring": (
        lambda: ForwardOnlyCostModel(SplitLimitedCostModel(_llama(), "ring")),
        TEXT,
        [1, 4, 16],
    ),
    "forward-only video": (lambda: ForwardOnlyCostModel(_stdit()), VIDEO, [1, 2, 4]),
    "forward-only fitted": (lambda: ForwardOnlyCostModel(fitted()), TEXT[:4], [1, 2]),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_cost_model_keeps_its_floors_promises_or_offers_none(name):
    make, shapes, sizes = MODELS[name]
    cost = make()
    if "fitted" in name:
        assert not has_floor(cost)  # a fitted model proves nothing: the priced bound
        return
    assert has_floor(cost)
    assert contract_violations(cost, shapes, sizes, np.random.default_rng(0)) == []


def _package_classes(base):
    found = []
    for sub in base.__subclasses__():
        if sub.__module__.startswith("datacentric."):
            found.append(sub)
        found += _package_classes(sub)
    return found


def test_every_cost_model_class_of_the_package_is_checked():
    checked = set()
    for make, _, _ in MODELS.values():
        cost = make()
        while True:
            checked.add(type(cost))
            if not isinstance(cost, WrappedCostModel):
                break
            cost = cost.inner
    assert set(_package_classes(CachedCostModel)) - {WrappedCostModel} <= checked


class _Halved(WrappedCostModel):
    """A planted fault: a wrapper that halves every pass's time."""

    def compute_breakdown(self, shapes, sp_size, key):
        found = split_breakdown(self.inner, shapes, sp_size, key)
        return dataclasses.replace(found, time_s=found.time_s / 2)

    def compute_split_breakdown(self, shapes, sp_size, ring_size, key):
        found = split_breakdown(self.inner, shapes, sp_size, key, ring_size)
        return dataclasses.replace(found, time_s=found.time_s / 2)

    def supports_split(self, sp_size, ring_size):
        return self.inner.supports_split(sp_size, ring_size)


def test_a_wrapper_that_shrinks_time_without_its_floor_is_caught():
    halved = _Halved(_llama())
    assert not has_floor(halved)  # a wrapper inherits no floor unless it says so

    class Claiming(_Halved):
        same_prices = True  # wrongly

    claiming = Claiming(_llama())
    assert has_floor(claiming)
    broken = contract_violations(claiming, TEXT, [1, 2, 8, 16], np.random.default_rng(0), 20)
    assert any("time" in b for b in broken)
