"""The execution model on hand-built schedules with a toy cost model (exact numbers)."""

from dataclasses import replace

import pytest
from toy_schedule import SHAPES, ToyCostModel, micro_batch, toy_schedule

from datacentric.planning.cost_model import CostModel
from datacentric.schedule import Assignment, Iteration, Schedule
from datacentric.sim.engine import PlanDoesNotFitError, simulate
from datacentric.timing import COMPUTE, SYNC


def test_toy_is_a_cost_model():
    assert isinstance(ToyCostModel(), CostModel)


def test_exact_makespans_idle_and_throughput():
    result = simulate(toy_schedule(), SHAPES, ToyCostModel(), ideal_epoch_time_s=2.0)
    it0, it1 = result.iterations
    assert it0.makespan_s == pytest.approx(1.1)  # 2000 tokens / 2 ranks + all-to-all
    assert it0.idle_share == pytest.approx(1 - (2 * 1.1 + 0.8 + 0.2) / (4 * 1.1))
    assert it0.time_s == pytest.approx(1.6)  # plus the exposed gradient sync
    assert it1.makespan_s == pytest.approx(0.62) and it1.idle_share == pytest.approx(0.0)
    assert result.epoch_time_s == pytest.approx(2.72)
    assert result.tokens == 5000 and result.samples == 6
    assert result.tokens_per_s == pytest.approx(5000 / 2.72)
    assert result.idle_share == pytest.approx(1 - (3.2 + 4 * 0.62) / (4 * (1.1 + 0.62)))
    assert result.efficiency == pytest.approx(2.0 / 2.72)
    assert result.recompute_gpu_s == pytest.approx(4 * 0.02)
    summary = result.summary()
    assert summary["grad_sync_share"] == pytest.approx(1.0 / 2.72)
    assert summary["idle_share_mean_per_iteration"] == pytest.approx(it0.idle_share / 2)


def test_spans_per_group_back_to_back():
    result = simulate(toy_schedule(), SHAPES, ToyCostModel())
    spans = [s for s in result.spans if s.rank == 2 and s.kind == COMPUTE and s.iteration == 0]
    assert [(s.start_s, s.end_s) for s in spans] == [
        pytest.approx((0.0, 0.5)),
        pytest.approx((0.5, 0.8)),
    ]
    assert [s.micro_batch for s in spans] == [1, 2]  # named by id: the first sample
    last = [s for s in result.spans if s.iteration == 1 and s.kind != SYNC]
    # one compute, one recompute and one all-to-all span on each of the four ranks
    assert sorted(s.rank for s in last) == [r for r in range(4) for _ in range(3)]
    assert {s.micro_batch for s in last} == {4}
    assert min(s.start_s for s in last) == pytest.approx(1.6)
    assert max(s.end_s for s in last) == pytest.approx(1.6 + 0.62)
    run = result.micro_batches[4]
    assert list(run.ranks) == [0, 1, 2, 3] and run.tokens == 2000
    syncs = [s for s in result.spans if s.kind == SYNC]
    assert len(syncs) == 8
    assert sorted({round(s.start_s, 9) for s in syncs}) == [1.1, 2.22]
    assert result.efficiency is None


def test_memory_check_names_the_micro_batch():
    # 2000 tokens * 100 B on 4 ranks = 50 kB in iteration 1; 100 kB in iteration 0 group 0.
    def capped(cap: int) -> Schedule:
        return replace(toy_schedule(), memory_cap_bytes=cap)

    with pytest.raises(PlanDoesNotFitError, match=r"iteration 0, group of ranks 0\.\.1 \(sp 2\)"):
        simulate(capped(60_000), SHAPES, ToyCostModel())
    with pytest.raises(PlanDoesNotFitError, match="micro-batch 0"):
        simulate(capped(99_999), SHAPES, ToyCostModel())
    simulate(capped(100_000), SHAPES, ToyCostModel())  # exactly fits
    with pytest.raises(ValueError, match="carries no memory budget"):
        simulate(replace(toy_schedule(), memory_cap_bytes=None), SHAPES, ToyCostModel())


def test_shapes_must_match_the_schedule():
    with pytest.raises(ValueError, match="6 samples"):
        simulate(toy_schedule(), SHAPES[:5], ToyCostModel())


def test_pass_costs_are_the_models_cached_breakdowns():
    model = ToyCostModel()
    simulate(toy_schedule(), SHAPES, model)
    calls = model.calls
    simulate(toy_schedule(), SHAPES, model)
    assert model.calls == calls
    assert model.breakdown([SHAPES[4], SHAPES[5]], 4, (True, True)).recompute_s == pytest.approx(
        0.02
    )


def test_alltoall_share_from_the_breakdown():
    result = simulate(toy_schedule(), SHAPES, ToyCostModel())
    # iteration 0: one group of 2 ranks (0.1 s each); iteration 1: one group of 4
    assert result.comm_gpu_s == pytest.approx(2 * 0.1 + 4 * 0.1)


def test_grad_sync_overlaps_the_slowest_groups_last_backward():
    result = simulate(toy_schedule(), SHAPES, ToyCostModel(), overlap_grad_sync=True)
    it0, it1 = result.iterations
    # iteration 0: the slowest group's pass is 1.1 s, backward 2/3 of it > 0.5 s reduction
    assert it0.grad_sync_s == 0.0 and it0.time_s == pytest.approx(1.1)
    # iteration 1: 0.62 s pass with 0.02 s recompute: forward 0.2, backward 0.42
    assert it1.grad_sync_s == pytest.approx(0.5 - 0.42)
    assert result.epoch_time_s == pytest.approx(1.1 + 0.62 + 0.08)


def test_a_group_of_a_later_phase_starts_when_all_its_ranks_are_free():
    """Phase 0: an SP-2 group on ranks 0-1 (1.1 s) beside two single ranks (0.5 s,
    0.3 s); phase 1: ranks 0-1 alone, ranks 2-3 as one SP-2 group, which waits for
    rank 2 (0.5 s), not for the slower SP-2 group of phase 0."""
    it = Iteration(
        index=0,
        assignments=(
            Assignment(0, 2, (micro_batch((0,)),)),
            Assignment(2, 1, (micro_batch((1,)),)),
            Assignment(3, 1, (micro_batch((2,)),)),
            Assignment(0, 1, (micro_batch((3,)),), phase=1),
            Assignment(1, 1, (micro_batch((4,)),), phase=1),
            Assignment(2, 2, (micro_batch((5,)),), phase=1),
        ),
    )
    schedule = Schedule(
        world_size=4,
        policy="toy",
        seed=0,
        epoch=0,
        num_samples=6,
        iterations=(it,),
        memory_cap_bytes=10**6,
    )
    result = simulate(schedule, SHAPES, ToyCostModel(), record_spans=True)
    (step,) = result.iterations
    starts = {(s.rank, s.micro_batch): s.start_s for s in result.spans if s.kind == COMPUTE}
    assert starts[(0, 3)] == pytest.approx(1.1) and starts[(1, 4)] == pytest.approx(1.1)
    assert starts[(2, 5)] == pytest.approx(0.5) and starts[(3, 5)] == pytest.approx(0.5)
    # rank 0: 1.1 + 0.2; rank 1: 1.1 + 1.0; ranks 2-3: 0.5 + 1000 / 2 ms + 0.1
    assert step.makespan_s == pytest.approx(2.1)
    busy = 2 * 1.1 + 0.5 + 0.3 + 0.2 + 1.0 + 2 * 0.6
    assert step.idle_share == pytest.approx(1 - busy / (4 * 2.1))
