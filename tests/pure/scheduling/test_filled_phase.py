"""dcp-opt's own search: half-step clips first with fillers, packed samples alone."""

from __future__ import annotations

from datacentric.data.workloads import get_workload
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import dcp_opt, step_phases
from datacentric.scheduling.measures import epoch_estimate_s
from datacentric.scheduling.pipeline import Pipeline


def test_clips_of_half_a_step_run_first_each_on_a_group_of_its_own(monkeypatch):
    """2,000 samples of opensora-long at 8 H100s: its 432K-token clips take about half
    a step on their cheapest size. dcp-opt's own search (no portfolio) runs some steps
    in two phases, those clips first with the longest other micro-batches filling the
    ranks left (``filled_phase``), and its epoch is shorter than without that option;
    every step is valid."""
    monkeypatch.setattr(dcp_opt, "PORTFOLIO_SAMPLES", 0)
    wl = get_workload("opensora-long", seed=0, num_samples=2_000)
    shapes = list(wl.shapes)
    cost = analytic_cost_model(wl.model, "h100-sxm", world_size=8)

    def epoch() -> tuple[float, object]:
        pipe = Pipeline(shapes, cost, world_size=8, memory_cap_bytes=56_000_000_000)
        schedule = pipe.schedule(0, policy="dcp-opt", measure=False)
        schedule.validate()
        return epoch_estimate_s(schedule.iterations, cost, shapes, 8), schedule

    with_it, schedule = epoch()
    calls = []
    filled = step_phases.filled_phase
    monkeypatch.setattr(
        step_phases, "filled_phase", lambda *a: calls.append(filled(*a)) or calls[-1]
    )
    assert epoch()[0] == with_it  # the same search, watched
    kept = [it for it in schedule.iterations if it in calls]
    assert kept, "no step kept its filled phases"
    for it in kept:
        first = [a for a in it.assignments if a.phase == 0]
        longest = max(mb.est_time_s for a in it.assignments for mb in a.micro_batches)
        assert any(mb.est_time_s == longest for a in first for mb in a.micro_batches)
    monkeypatch.setattr(step_phases, "filled_phase", lambda *a: None)
    without, _ = epoch()
    assert with_it < without * (1 - 1e-3), (with_it, without)


def test_a_few_packed_remainders_run_alone_where_that_balances_better(monkeypatch):
    """One step of 8,192-token packed rows and 30 remainders at 8 H200s (llama-7b): the
    remainders packed in pairs and triples left the 8 single-GPU groups 0.9% apart and
    static (every remainder alone) ahead; dcp-opt's own search (no portfolio) now also
    solves the step with its packed samples alone, and is not behind static."""
    from datacentric.settings import SchedulingConfig
    from datacentric.shapes import SampleShape

    rest = [184, 276, 883, 971, 1082, 1083, 1914, 2042, 2219, 2254, 2315, 3160, 3493, 3744]
    rest += [3825, 4002, 4477, 4753, 4963, 5106, 5732, 5933, 6223, 6322, 6356, 6603, 6717]
    rest += [6779, 7158, 7742]
    lengths = [8_192] * 241 + rest
    shapes = [SampleShape.text(n) for n in lengths]
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=8)
    options = SchedulingConfig(global_batch_tokens=sum(lengths))
    monkeypatch.setattr(dcp_opt, "PORTFOLIO_SAMPLES", 0)

    def epoch(policy: str) -> float:
        pipe = Pipeline(
            shapes, cost, world_size=8, memory_cap_bytes=98_700_000_000, options=options
        )
        schedule = pipe.schedule(0, policy=policy, measure=False)
        schedule.validate()
        assert len(schedule.iterations) == 1
        return epoch_estimate_s(schedule.iterations, cost, shapes, 8)

    static = epoch("static")
    assert epoch("dcp-opt") <= static * (1 + 1e-9)
    monkeypatch.setattr(dcp_opt, "UNPACK_PER_RANK", 0)  # packed samples stay packed
    assert epoch("dcp-opt") > static
