"""The proved price: the cost model keeps its floor's promises, and an exhaustive search
of small instances finds no schedule below the bound."""

from __future__ import annotations

from functools import cache

import pytest

from datacentric.planning.bucket_options import accepted_splits, mixable_sp_sizes
from datacentric.planning.cost_model import split_breakdown, supports_split
from datacentric.planning.proved_price import _flags, count_grid, proved_prices
from datacentric.profiling.factory import analytic_cost_model
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.scheduling.micro_batches import check_layout
from datacentric.shapes import SampleShape

CAP = 98_700_000_000  # 70% of an H200's memory


@pytest.fixture(scope="module")
def llama():
    """llama-7b on 8-GPU H200 nodes (64 GPUs: rings across nodes are priced)."""
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def _floor(cost, shapes, sp, flags, ring, linear=False):
    if ring == 1:
        return cost.pass_floor(shapes, sp, flags)
    return cost.pass_floor(shapes, sp, flags, ring_size=ring, ring_linear=linear)


def _configs(cost, sizes):
    grid, names, kinds, _ = count_grid(cost)
    flags = [_flags([int(c) for c in row], names, kinds) for row in grid]
    return [(sp, ring, f) for sp in sizes for ring in _every_divisor(cost, sp) for f in flags]


def _every_divisor(cost, sp):
    """Every ring degree dividing ``sp`` the model prices (written out here, not read
    from the code under test)."""
    return [r for r in range(1, sp + 1) if sp % r == 0 and supports_split(cost, sp, r)]


def _longest_alone(cost, sp, flags, ring):
    """The longest text sample whose floor bytes fit the cap (bisection)."""
    lo, hi = 0, 1 << 24
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = _floor(cost, (SampleShape.text(mid),), sp, flags, ring)[1] <= CAP
        lo, hi = (mid, hi) if fits else (lo, mid)
    return lo


def _direct_price(cost, shape, sizes):
    """The proved price by brute force: every configuration's floor evaluated (on a
    ring, charging the exposed transfer linearly where that gains at the longest
    sample that fits)."""
    best = float("inf")
    for sp, ring, flags in _configs(cost, sizes):
        linear = False
        if ring > 1:
            top = SampleShape.text(max(1, _longest_alone(cost, sp, flags, ring)))
            gain = [_floor(cost, (top,), sp, flags, ring, x)[0] for x in (False, True)]
            linear = gain[1] >= gain[0]
        fixed_s, fixed_b = _floor(cost, (), sp, flags, ring, linear)
        secs, byts = _floor(cost, (shape,), sp, flags, ring, linear)
        room = CAP - fixed_b
        if byts - fixed_b <= room:
            best = min(best, sp * (secs - fixed_s + fixed_s * (byts - fixed_b) / room))
    return best


def test_the_vectorised_search_equals_brute_force(llama):
    sizes = [1, 2, 4, 8, 16]
    shapes = [SampleShape.text(n) for n in (16, 128, 5_700, 6_000, 91_000, 131_072, 400_000)]
    prices = proved_prices(llama, shapes, sizes, CAP)
    for shape, price in zip(shapes, prices):
        assert price == pytest.approx(_direct_price(llama, shape, sizes), rel=1e-7)
    stdit = analytic_cost_model("stdit-1.1b", "h100-sxm", world_size=8)
    video = [SampleShape.video(30, 30, 53), SampleShape.video(51, 90, 160)]
    prices = proved_prices(stdit, video, [1, 2], CAP)
    for shape, price in zip(video, prices):
        assert price == pytest.approx(_direct_price(stdit, shape, [1, 2]), rel=1e-7)


def _partitions(items):
    """Every partition of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]


def _cheapest_schedule_gpu_seconds(cost, shapes, sizes):
    """The fewest GPU-seconds any schedule of ``shapes`` spends: every partition into
    micro-batches, each on its cheapest SP size, split and recomputation count that fits
    (every real pass, not its floor). A step's makespan is at least this over the world."""
    configs = _configs(cost, sizes)

    @cache
    def cheapest(block: tuple[int, ...]) -> float:
        batch = [shapes[i] for i in block]
        best = float("inf")
        for sp, ring, flags in configs:
            b = split_breakdown(cost, batch, sp, flags, ring)
            if b.memory_bytes <= CAP:
                best = min(best, sp * b.time_s)
        return best

    return min(
        sum(cheapest(tuple(block)) for block in part)
        for part in _partitions(list(range(len(shapes))))
    )


@pytest.mark.parametrize(
    "lengths, world",
    [
        ([6_000, 128, 128, 128, 128, 128], 8),  # short samples riding with a long one
        ([5_700, 5_700, 5_700, 5_700], 4),  # two per micro-batch, one block recomputed
        ([91_000, 91_000, 131_072], 8),
        ([164_000, 40_000, 2_000], 8),
        ([30_000, 12_000, 3_000, 700, 64], 2),
        # long documents at 4 GPUs: a ring over a node's 4 GPUs beats Ulysses there
        ([80_000, 80_000], 4),
        ([80_000, 40_000, 9_000], 4),
        ([120_000, 20_000, 2_000, 300], 4),
        ([60_000, 60_000, 60_000], 4),
        ([100_000, 5_000, 5_000, 128], 4),
        ([160_000, 30_000], 8),
        # worlds that are not powers of two: the whole world is one group (a ring of 3;
        # 6 = Ulysses 2 x ring 3, or a ring of 6)
        ([60_000, 30_000, 2_000], 3),
        ([120_000, 40_000, 500], 6),
    ],
)
def test_no_schedule_of_a_small_instance_beats_the_bound(lengths, world):
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=world)
    shapes = [SampleShape.text(n) for n in lengths]
    sizes = [s for s in mixable_sp_sizes(world)]
    bound = float(proved_prices(cost, shapes, sizes, CAP).sum())
    cheapest = _cheapest_schedule_gpu_seconds(cost, shapes, sizes)
    assert bound <= cheapest
    assert bound >= 0.9 * cheapest  # a bound close to what schedules reach


@pytest.mark.parametrize("world", [*range(1, 9), 64])
def test_the_bound_quantifies_over_every_split_a_schedule_may_run(world):
    """The (SP size, ring degree) pairs the proof prices equal those a schedule's step
    may hold: a layout ``check_layout`` (``Schedule.validate`` and the runtime's process
    groups) accepts, on a split the cost model prices."""
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=world)
    accepted = set()
    for sp in range(1, world + 1):
        for ring in range(1, sp + 2):
            try:
                mb = MicroBatch((0,), "x", 1, ring_size=ring)
                groups = tuple(Assignment(start, sp, (mb,)) for start in range(0, world, sp))
                check_layout(Iteration(0, groups), world)
            except ValueError:
                continue
            if supports_split(cost, sp, ring):
                accepted.add((sp, ring))
    priced = {(sp, r) for sp in mixable_sp_sizes(world) for r in accepted_splits(cost, sp)}
    assert priced == accepted
    assert any(r > 1 and sp <= cost.gpus_per_node for sp, r in priced) == (world > 1)
