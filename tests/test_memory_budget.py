"""One memory budget: resolved once, held by the plan, copied onto the schedule, and
read there by the simulator, whatever the cost model was built with."""

from __future__ import annotations

import pytest
import torch

from datacentric import DataCentric
from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.planning.hardware import gib_to_bytes
from datacentric.planning.memory_cap import resolve_memory_cap
from datacentric.profiling.factory import analytic_cost_model
from datacentric.schedule import Schedule
from datacentric.shapes import SampleShape
from datacentric.sim.engine import simulate


def test_data_centric_and_the_simulator_use_the_plans_budget():
    torch.manual_seed(0)
    shapes = [SampleShape.text(n) for n in (4096, 3000, 2048, 1500, 700, 300)] * 2
    dataset = SyntheticTextDataset(shapes, seed=0)
    # the cost model is built for a device of 0.01 GiB; the run's budget is 1 GiB
    cost_model = analytic_cost_model("llama", "cpu-local", memory_gb=0.01)
    memory_gb = 1.0
    dc = DataCentric(
        build_model("llama"),
        dataset,
        cost_model=cost_model,
        memory_gb=memory_gb,
        groups=ProcessGroups.local(),
        policy="dcp-opt",
        prefetch=0,
        shard="none",
    )
    try:
        schedule = dc.schedule(0)
    finally:
        dc.close()
    budget = gib_to_bytes(memory_gb)
    assert dc.planner.plan.memory_cap_bytes == budget
    assert schedule.memory_cap_bytes == budget
    assert Schedule.from_json(schedule.to_json()).memory_cap_bytes == budget
    largest = max(
        cost_model.pass_memory_bytes([shapes[i] for i in mb.sample_ids], a.sp_size, mb.recompute)
        for it in schedule.iterations
        for a in it.assignments
        for mb in a.micro_batches
    )
    # the schedule uses more than the cost model's own cap: only the one budget fits it
    assert cost_model.memory_capacity_bytes < largest <= budget
    result = simulate(schedule, shapes, cost_model)
    assert result.epoch_time_s > 0


def test_the_default_budget_is_a_share_of_the_device():
    assert resolve_memory_cap(2.0, 10**12) == gib_to_bytes(2.0)
    assert resolve_memory_cap(None, 1000) == 700
    with pytest.raises(ValueError, match="set memory_gb"):
        resolve_memory_cap(None, None)
