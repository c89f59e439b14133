"""What the analytic model keeps between passes (model-state bytes, recomputed counts,
the spec's derived counts) follows the settings it was made from."""

from __future__ import annotations

from dataclasses import replace

from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.factory import analytic_cost_model
from datacentric.shapes import SampleShape


def test_kept_figures_follow_their_settings() -> None:
    model = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    model.sharding = ShardingSpec("fsdp2")
    sharded = model.model_state_bytes()
    model.sharding = ShardingSpec("none")
    replicated = model.model_state_bytes()
    assert sharded < replicated
    model.sharding = ShardingSpec("fsdp2")
    model.world_size = 8
    assert sharded < model.model_state_bytes() < replicated
    spec = model.spec
    frozen = replace(spec, trainable_params=spec.num_params // 100)
    assert (
        frozen.trained_params == spec.num_params // 100 and spec.trained_params == spec.num_params
    )
    assert frozen.weight_grad_share < spec.weight_grad_share == 1.0
    flags = (True,) * 10 + (False,) * 22
    assert model._counts(flags) == model._counts(list(flags)) == (10,)
    assert model._counts((False,) * 32) == (0,)


def test_a_rings_memory_is_asked_without_its_time_formula() -> None:
    from datacentric.planning.cost_model import split_breakdown, split_memory_bytes
    from datacentric.shapes import SampleShape

    model = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    fresh = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    timed = []
    compute = model.compute_split_breakdown
    model.compute_split_breakdown = lambda *a: timed.append(1) or compute(*a)
    shapes = [SampleShape.text(37_000)]
    for ring, flags in ((8, (False,) * 32), (2, (True,) * 32)):
        expected = split_breakdown(fresh, shapes, 8, flags, ring).memory_bytes
        assert split_memory_bytes(model, shapes, 8, flags, ring) == expected
    assert not timed


def test_a_pass_recomputing_nothing_is_worked_out_once_for_every_setting_and_spec() -> None:
    model = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
    calls = []
    work = model._work
    model._work = lambda *args, **kw: calls.append(args[2]) or work(*args, **kw)
    shapes = [SampleShape.text(30_000), SampleShape.text(9_000)]
    settings = [(True,) * 32, (True,) * 12 + (False,) * 20, (False,) * 32]
    for sp, ring in ((8, 1), (16, 4)):
        for flags in settings:
            got = model.breakdown(shapes, sp, flags, ring_size=ring)
            fresh = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)
            assert got == fresh.breakdown(shapes, sp, flags, ring_size=ring)  # to the bit
    assert calls.count((0,)) == 2  # once per pass (SP 8, SP 16 on a ring of 4)
    model.spec = replace(model.spec, hidden=model.spec.hidden * 2)  # another spec: afresh
    flags = (True,) * 20 + (False,) * 12  # a setting not priced yet, on a pass kept
    wider = model.breakdown(shapes, 8, flags)
    assert calls.count((0,)) == 3 and wider.time_s > got.time_s
