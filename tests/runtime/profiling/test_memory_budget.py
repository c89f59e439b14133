"""One memory budget: resolved once, held by the plan, copied onto the schedule, and
read there by the simulator, whatever device the cost model prices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from datacentric import DataCentric
from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.planning.hardware import gib_to_bytes
from datacentric.planning.memory_cap import device_memory_of, resolve_memory_cap
from datacentric.profiling.factory import analytic_cost_model, resolve_hardware
from datacentric.schedule import Schedule
from datacentric.shapes import SampleShape
from datacentric.sim.engine import PlanDoesNotFitError, simulate
from datacentric.sim.policy_comparison import run_policies


def test_data_centric_and_the_simulator_use_the_one_budget():
    torch.manual_seed(0)
    shapes = [SampleShape.text(n) for n in (4096, 3000, 2048, 1500, 700, 300)] * 2
    dataset = SyntheticTextDataset(shapes, seed=0)
    # the cost model prices a device of 0.01 GiB; the run's budget is 1 GiB
    small = replace(resolve_hardware("cpu-local"), memory_bytes=gib_to_bytes(0.01))
    cost_model = analytic_cost_model("llama", small)
    memory_gb = 1.0
    budget = gib_to_bytes(memory_gb)
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
    assert dc.pipeline.plan.memory_cap_bytes == budget
    assert schedule.memory_cap_bytes == budget
    assert Schedule.from_json(schedule.to_json()).memory_cap_bytes == budget
    largest = max(
        cost_model.pass_memory_bytes([shapes[i] for i in mb.sample_ids], a.sp_size, mb.recompute)
        for it in schedule.iterations
        for a in it.assignments
        for mb in a.micro_batches
    )
    # the schedule uses more than the priced device's default share: only the one
    # budget fits it, and the simulator reads that one
    assert resolve_memory_cap(None, device_memory_of(cost_model)) < largest <= budget
    assert simulate(schedule, shapes, cost_model).epoch_time_s > 0
    runs = run_policies(shapes, cost_model, 1, ["static", "dcp-opt"], memory_cap_bytes=budget)
    assert {run.schedule.memory_cap_bytes for run in runs.values()} == {budget}
    # a tighter budget on the schedule is what the simulator checks against
    with pytest.raises(PlanDoesNotFitError, match="the plan does not fit"):
        simulate(replace(schedule, memory_cap_bytes=largest - 1), shapes, cost_model)


def test_the_default_budget_is_a_share_of_the_device():
    assert resolve_memory_cap(2.0, 10**12) == gib_to_bytes(2.0)
    assert resolve_memory_cap(None, 1000) == 700
    with pytest.raises(ValueError, match="set memory_gb"):
        resolve_memory_cap(None, None)
