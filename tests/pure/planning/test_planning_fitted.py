"""Fitted cost model: recovers known component laws and predicts unprofiled shapes."""

from __future__ import annotations

import pytest

from datacentric.planning.cost_model import CostModel
from datacentric.planning.fitted import FittedCostModel, ProfilePoint, extrapolate
from datacentric.planning.planner import plan_buckets
from datacentric.shapes import Bucket, SampleShape


def synthetic_point(shapes: tuple[SampleShape, ...], sp: int) -> ProfilePoint:
    """Components following a known law: linear in tokens, quadratic causal attention."""
    t = sum(s.tokens for s in shapes) / sp
    pairs = sum(s.tokens * (s.tokens + 1) / 2 for s in shapes) / sp
    n = len(shapes)
    return ProfilePoint(
        shapes=shapes,
        sp_size=sp,
        base_time_s=1e-3 + 2e-7 * t,
        block_time_s=5e-4 + 3e-6 * t + 4e-10 * pairs + (2e-4 if sp > 1 else 0.0),
        recompute_time_s=1e-4 + 1e-6 * t + 1e-10 * pairs,
        base_memory_bytes=10**7 + 2000 * int(t),
        block_memory_bytes=10**5 + 9000 * int(t) + 100 * n,
        recomputed_block_memory_bytes=10**5 + 512 * int(t),
        transient_memory_bytes=8000 * int(t),
        block_state_bytes=10**5,
    )


PROFILED = [
    (SampleShape.text(n),) * bs for n, bs in ((256, 1), (256, 4), (1024, 1), (2048, 2), (4096, 1))
]


def fitted(sp_sizes=(1, 2)) -> FittedCostModel:
    points = [synthetic_point(shapes, sp) for sp in sp_sizes for shapes in PROFILED]
    return FittedCostModel(
        points,
        num_blocks=8,
        attention_kind="causal",
        gpus_per_node=2,
        grad_sync_seconds={2: 0.01},
    )


def test_extrapolate_is_linear_in_blocks() -> None:
    p = synthetic_point((SampleShape.text(1000),), 1)
    t2, m2 = extrapolate(p, 2, 0)
    t8, m8 = extrapolate(p, 8, 0)
    assert t8 - t2 == pytest.approx(6 * p.block_time_s)
    assert m8 - m2 == 6 * p.block_memory_bytes
    t8r, m8r = extrapolate(p, 8, 3)
    assert t8r - t8 == pytest.approx(3 * p.recompute_time_s)
    end_of_forward = m8 + 3 * (p.recomputed_block_memory_bytes - p.block_memory_bytes)
    rematerialising = (
        p.base_memory_bytes
        + 5 * p.block_state_bytes
        + 3 * p.recomputed_block_memory_bytes
        + p.transient_memory_bytes
    )
    assert m8r == max(end_of_forward, rematerialising)
    # every block recomputing: the transient sits on top of the inputs
    _, m_all = extrapolate(p, 8, 8)
    expected_all = 8 * p.recomputed_block_memory_bytes + p.transient_memory_bytes
    assert m_all == p.base_memory_bytes + expected_all
    with pytest.raises(ValueError):
        extrapolate(p, 2, 3)


@pytest.mark.parametrize("shapes", [(SampleShape.text(3000),), (SampleShape.text(700),) * 3])
@pytest.mark.parametrize("sp", [1, 2])
def test_predicts_unprofiled_token_counts_and_batch_sizes(shapes, sp) -> None:
    model = fitted()
    truth = synthetic_point(shapes, sp)
    for recompute in ((), (True,) * 8, (True, False) * 4):
        k = sum(recompute)
        want_t, want_m = extrapolate(truth, 8, k)
        assert model.pass_time_s(shapes, sp, recompute) == pytest.approx(want_t, rel=1e-6)
        assert model.pass_memory_bytes(shapes, sp, recompute) == pytest.approx(want_m, rel=1e-6)


def test_protocol_sp_support_and_grad_sync() -> None:
    model = fitted()
    assert isinstance(model, CostModel)
    assert model.supports_sp_size(2) and not model.supports_sp_size(4)
    with pytest.raises(ValueError, match="not profiled"):
        model.pass_time_s([SampleShape.text(10)], 4, ())
    assert model.grad_sync_time_s(1) == 0.0
    assert model.grad_sync_time_s(2) == 0.01
    assert model.grad_sync_time_s(4) == pytest.approx(0.01 * 1.5)


def test_planner_runs_on_the_fitted_model() -> None:
    model = fitted()
    buckets = [Bucket(f"t<={n}", SampleShape.text(n)) for n in (256, 2048, 8192)]
    plan = plan_buckets(buckets, model, world_size=2, memory_cap_bytes=400 * 10**6)
    for name, b in plan.buckets.items():
        best = plan.preferred(name)
        assert best.sp_size in (1, 2)
        memory = model.pass_memory_bytes(
            [b.shape] * best.micro_batch_size, best.sp_size, best.recompute
        )
        assert memory <= 400 * 10**6
    # the 8192 bucket needs recomputation or SP 2 under this cap
    big = plan.preferred("t<=8192")
    assert big.sp_size == 2 or any(big.recompute)
