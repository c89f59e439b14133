"""The plan is the one authority on what a bucket runs with; one factory builds every
cost model (one GiB-to-bytes conversion); every model's breakdown sums to its pass time."""

from __future__ import annotations

import json

import pytest
from test_planning_fitted import fitted
from toy_cost_model import ToyCostModel, mixed_text, toy_pipeline

from datacentric.planning import bucket_options
from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.cost_model import CostModel
from datacentric.planning.memory_cap import resolve_memory_cap
from datacentric.planning.plan import Plan, PlanWithoutOptionsError
from datacentric.planning.planner import choose_recompute, plan_buckets
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import POLICIES, build_schedule
from datacentric.shapes import SampleShape, make_buckets

MODEL = ToyCostModel(capacity_bytes=16 * 2**20)
CAP = MODEL.capacity_bytes


def _settings(schedule) -> set[tuple[str, int, tuple[bool, ...]]]:
    return {
        (mb.bucket, a.sp_size, mb.recompute)
        for it in schedule.iterations
        for a in it.assignments
        for mb in a.micro_batches
    }


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_micro_batch_runs_with_one_of_its_buckets_plan_options(policy, monkeypatch):
    shapes = mixed_text()
    plan = plan_buckets(make_buckets(shapes), MODEL, world_size=8, memory_cap_bytes=CAP)

    def no_search(*args, **kwargs):
        raise AssertionError("a policy searched a configuration itself")

    monkeypatch.setattr(bucket_options, "max_batch", no_search)
    schedule = build_schedule(
        shapes, policy=policy, world_size=8, cost_model=MODEL, plan=plan, measure=False
    )
    schedule.validate()
    own_choices = 0
    for it in schedule.iterations:
        for a in it.assignments:
            for mb in a.micro_batches:
                options = {(o.sp_size, o.recompute) for o in plan.options_of(mb.bucket)}
                if (a.sp_size, mb.recompute) in options:
                    continue
                # dcp-pac, and dcp-opt (its own search runs PAC's knapsack per single
                # sample and per mixed micro-batch, and it takes steps from dcp-pac): the
                # knapsack on the micro-batch's own samples, and that is the planner's
                # function (choose_recompute), not the policy's
                assert policy in ("dcp-pac", "dcp-opt"), mb
                own = [shapes[i] for i in mb.sample_ids]
                choice = choose_recompute(MODEL, own, a.sp_size, CAP, mb.ring_size)
                assert choice is not None and choice.recompute == mb.recompute, mb
                own_choices += 1
    assert policy != "dcp-pac" or own_choices > 0  # the rule above is exercised


@pytest.mark.parametrize("policy", ["static", "dcp-intra", "dcp-inter", "dcp-pac", "dcp-opt"])
def test_a_plan_restricted_to_some_sp_sizes_yields_only_those(policy):
    shapes = mixed_text(200, seed=1)
    shapes = [s for s in shapes if s.tokens < 100_000]
    # SP 2, and the whole world for the tail iterations that merge groups
    plan = plan_buckets(
        make_buckets(shapes), MODEL, world_size=8, memory_cap_bytes=CAP, sp_sizes=[2, 8]
    )
    assert {o.sp_size for b in plan.buckets.values() for o in b.options} == {2, 8}
    schedule = build_schedule(shapes, policy=policy, world_size=8, cost_model=MODEL, plan=plan)
    used = {sp for _, sp, _ in _settings(schedule)}
    assert 2 in used and used <= {2, 8}
    free = toy_pipeline(shapes, MODEL, world_size=8, policy=policy).schedule()
    assert {sp for _, sp, _ in _settings(free)} - {2, 8}  # unrestricted, it uses others


def test_a_schedule_needs_a_plan_and_the_pipeline_gives_the_planners():
    shapes = mixed_text(120)
    with pytest.raises(TypeError, match="plan"):
        build_schedule(shapes, policy="dcp-opt", world_size=8, cost_model=MODEL)
    pipeline = toy_pipeline(shapes, MODEL, world_size=8)
    plan = plan_buckets(make_buckets(shapes), MODEL, world_size=8, memory_cap_bytes=CAP)
    assert pipeline.plan == plan
    given = build_schedule(shapes, policy="dcp-opt", world_size=8, cost_model=MODEL, plan=plan)
    made = pipeline.schedule()
    assert given.iterations == made.iterations
    assert made.memory_cap_bytes == made.meta["memory_cap_bytes"] == CAP


def test_plan_json_round_trips_with_its_options_and_old_plans_fail_clearly():
    shapes = mixed_text(120)
    plan = plan_buckets(make_buckets(shapes), MODEL, world_size=8, memory_cap_bytes=CAP)
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    a = build_schedule(shapes, policy="dcp-opt", world_size=8, cost_model=MODEL, plan=plan)
    b = build_schedule(shapes, policy="dcp-opt", world_size=8, cost_model=MODEL, plan=again)
    assert a.iterations == b.iterations
    old = plan.to_json()
    for row in old["buckets"]:
        del row["options"]
    old_plan = Plan.from_json(old)  # still loads (the CLI shows it) ...
    with pytest.raises(PlanWithoutOptionsError, match="plan the dataset again") as err:
        build_schedule(shapes, policy="dcp-opt", world_size=8, cost_model=MODEL, plan=old_plan)
    assert "\n" not in str(err.value)  # ... and cannot drive a schedule: one line why


def test_cost_models_hold_no_budget():
    assert "memory_capacity_bytes" not in dir(CostModel)
    cost = analytic_cost_model("llama", "cpu-local")
    with pytest.warns(DeprecationWarning, match="only price memory"):
        AnalyticCostModel(cost.spec, cost.hardware, memory_fraction=0.5)
    with pytest.warns(DeprecationWarning, match="without memory_cap_bytes"):
        plan = plan_buckets(make_buckets([SampleShape.text(300)]), cost, world_size=1)
    assert plan.memory_cap_bytes == resolve_memory_cap(None, cost.hardware.memory_bytes)
    with pytest.raises(TypeError, match="needs memory_cap_bytes"):  # and no deprecated cap
        with pytest.warns(DeprecationWarning):
            plan_buckets(make_buckets([SampleShape.text(300)]), fitted(), world_size=1)


@pytest.mark.parametrize(
    "model,sp_sizes",
    [
        (ToyCostModel(), (1, 2, 16)),
        (analytic_cost_model("llama", "cpu-local"), (1, 2)),
        (analytic_cost_model("stdit-1.1b", "h100-sxm", world_size=16), (1, 2, 16)),
        (analytic_cost_model("llama-7b", "h200-sxm"), (1, 8, 16)),
        (fitted(), (1, 2)),
    ],
)
def test_every_cost_models_breakdown_sums_to_its_pass_time(model, sp_sizes):
    video = getattr(getattr(model, "spec", None), "patch_channels", 0)
    shapes = (
        [SampleShape.video(16, 16, 16)] * 2
        if video
        else [SampleShape.text(512), SampleShape.text(2048)]
    )
    blocks = model.num_blocks
    for sp in sp_sizes:
        for rc in ((False,) * blocks, (True,) * blocks, (True,) + (False,) * (blocks - 1)):
            cost = model.breakdown(shapes, sp, rc)
            parts = cost.compute_s + cost.recompute_s + cost.comm_s
            assert cost.time_s == pytest.approx(parts, rel=1e-12)
            assert min(cost.compute_s, cost.recompute_s, cost.comm_s) >= 0
            assert model.pass_time_s(shapes, sp, rc) == cost.time_s
            assert model.pass_memory_bytes(shapes, sp, rc) == cost.memory_bytes
        assert model.breakdown(shapes, sp, (False,) * blocks).recompute_s == 0
