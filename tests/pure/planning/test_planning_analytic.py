"""Analytic cost model, presets and hardware calibration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from datacentric.planning.analytic import AnalyticCostModel, analytic_model
from datacentric.planning.cost_model import CostModel
from datacentric.planning.hardware import (
    CalibrationPoint,
    calibrate_hardware,
    datasheet_hardware,
    get_hardware,
    list_hardware,
)
from datacentric.planning.pass_work import attention_pairs
from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.factory import analytic_cost_model, get_model_spec, list_model_specs
from datacentric.shapes import SampleShape


def test_presets_exist_and_match_published_sizes() -> None:
    assert {"h100-sxm", "h200-sxm", "cpu-local"} <= set(list_hardware())
    assert {"stdit-1.1b", "dit3d-1b", "llama-7b", "llama-13b", "llama", "dit"} <= set(
        list_model_specs()
    )
    assert get_model_spec("stdit-1.1b").num_params == pytest.approx(1.1e9, rel=0.1)
    assert get_model_spec("llama-7b").num_params == pytest.approx(6.74e9, rel=0.01)
    assert get_model_spec("llama-13b").num_params == pytest.approx(13.0e9, rel=0.01)
    assert get_model_spec("dit3d-1b").num_params == pytest.approx(1.2e9, rel=0.1)
    assert get_hardware("h200-sxm").memory_bytes > get_hardware("h100-sxm").memory_bytes
    with pytest.raises(KeyError, match="unknown hardware"):
        get_hardware("tpu-v9")


def test_attention_pairs_by_kind() -> None:
    video = SampleShape.video(4, 3, 5)
    assert attention_pairs("full", video) == 60 * 60
    assert attention_pairs("spatial", video) == 4 * 15 * 15
    assert attention_pairs("temporal", video) == 15 * 4 * 4
    assert attention_pairs("causal", SampleShape.text(10)) == 55


def model(name: str = "llama-7b", **kwargs) -> AnalyticCostModel:
    return AnalyticCostModel(get_model_spec(name), get_hardware("h100-sxm"), **kwargs)


def test_implements_the_protocol() -> None:
    assert isinstance(model(), CostModel)


def test_time_grows_quadratically_and_sp_divides_it() -> None:
    m = model()
    t = [m.pass_time_s([SampleShape.text(n)], 1, ()) for n in (32768, 65536, 131072)]
    # beyond linear: attention's quadratic term dominates long sequences
    assert t[1] / t[0] > 2.2 and t[2] / t[1] > t[1] / t[0]
    t_sp = m.pass_time_s([SampleShape.text(131072)], 8, ())
    assert t[2] / 8 < t_sp < t[2] / 4  # compute split 8 ways, plus all-to-all


def test_recomputation_trades_time_for_memory() -> None:
    m = model()
    shapes = [SampleShape.text(8192)] * 2
    full, none = (True,) * 32, (False,) * 32
    assert m.pass_time_s(shapes, 1, full) > m.pass_time_s(shapes, 1, none)
    assert m.pass_memory_bytes(shapes, 1, full) < m.pass_memory_bytes(shapes, 1, none)
    # one recomputed block costs about one block's forward: 1/3 of its fwd+bwd
    ratio = m.pass_time_s(shapes, 1, full) / m.pass_time_s(shapes, 1, none)
    assert 1.2 < ratio < 1.4


def test_memory_scales_with_sp_and_state_sharding() -> None:
    m = model()
    act = m.pass_memory_bytes([SampleShape.text(65536)], 1, ()) - m.model_state_bytes()
    act8 = m.pass_memory_bytes([SampleShape.text(65536)], 8, ()) - m.model_state_bytes()
    assert act8 == pytest.approx(act / 8, rel=0.01)
    none = model(sharding=ShardingSpec("none"), world_size=32).model_state_bytes()
    fsdp2 = model(sharding=ShardingSpec("fsdp2"), world_size=32).model_state_bytes()
    resharded = model(sharding=ShardingSpec("fsdp2", True), world_size=32).model_state_bytes()
    # bf16: 2 param + 2 grad + 12 optimizer bytes per parameter, the optimizer's split
    assert none == pytest.approx(m.spec.num_params * 16, rel=1e-6)
    assert fsdp2 == pytest.approx(m.spec.num_params * (4 + 16 / 32), rel=1e-6)
    assert resharded < fsdp2 < none / 3
    assert model(sharding=ShardingSpec("fsdp2"), world_size=1).model_state_bytes() == none


def test_crossing_a_node_costs_more_than_nvlink() -> None:
    m = model()
    shapes = [SampleShape.text(1 << 20)]
    w8, w16 = m.work(shapes, 8, ()), m.work(shapes, 16, ())
    assert w8.ib_bytes == 0 and w16.ib_bytes > 0
    assert m.grad_sync_time_s(16) > m.grad_sync_time_s(8) > m.grad_sync_time_s(1) == 0


def test_frame_sharded_spatial_blocks_need_no_alltoall() -> None:
    m = AnalyticCostModel(get_model_spec("stdit-1.1b"), get_hardware("h100-sxm"))
    video = [SampleShape.video(32, 30, 54)]
    assert m._alltoall("spatial", tuple(video), 4, 1.0)[1] == 0
    assert m._alltoall("temporal", tuple(video), 4, 1.0)[1] == 2
    image = (SampleShape.video(1, 30, 54),)  # one frame cannot be split: Ulysses
    assert m._alltoall("spatial", image, 4, 1.0)[1] == 2  # stacked q/k/v, then out


def test_calibration_recovers_known_constants() -> None:
    truth = replace(
        datasheet_hardware("h100-sxm"),
        matmul_efficiency=0.31,
        attention_efficiency=0.22,
        block_overhead_s=3e-4,
        half_efficiency_tokens=0.0,
    )
    start = replace(truth, matmul_efficiency=0.9, attention_efficiency=0.9, block_overhead_s=0)
    spec = get_model_spec("llama-7b")
    true_model = AnalyticCostModel(spec, truth)
    points = []
    for n in (512, 2048, 8192, 32768):
        for sp in (1, 2):
            shapes = [SampleShape.text(n)]
            w = true_model.work(shapes, sp, ())
            points.append(
                CalibrationPoint(
                    matmul_flops=w.matmul_flops,
                    attention_flops=w.all_attention_flops,
                    memory_bytes=w.memory_bytes,
                    network_bytes=w.nvlink_bytes,
                    collectives=w.collectives,
                    block_passes=w.block_passes,
                    seconds=true_model.pass_time_s(shapes, sp, ()),
                )
            )
    fitted = calibrate_hardware(start, points)
    fitted_model = AnalyticCostModel(spec, fitted)
    for n in (1024, 16384):
        shapes = [SampleShape.text(n)]
        assert fitted_model.pass_time_s(shapes, 2, ()) == pytest.approx(
            true_model.pass_time_s(shapes, 2, ()), rel=0.02
        )


@pytest.mark.parametrize("model", ["llama-7b", "stdit-1.1b"])
def test_memory_alone_and_one_pass_sums_answer_as_the_whole_formula(model):
    """``pass_memory_bytes`` answered without the time formula, and the shapes' sums
    taken once per pass, give what the per-sample formulas give: memory equal to the
    breakdown's on random micro-batches (text and video, mixed lengths, recomputing
    some blocks), attention pairs equal to the per-sample sums."""
    import random

    from datacentric.planning.pass_work import shape_sums

    cost = analytic_cost_model(model, "h100-sxm", world_size=16)
    fresh = analytic_cost_model(model, "h100-sxm", world_size=16)
    rng = random.Random(3)
    for _ in range(60):
        n = rng.choice([1, 2, 7, 30])
        if model.startswith("llama"):
            shapes = [SampleShape.text(rng.randint(1, 50_000)) for _ in range(n)]
        else:
            shapes = [
                SampleShape.video(*(rng.choice([2, 4, 8, 16]) for _ in range(3))) for _ in range(n)
            ]
        sp = rng.choice([1, 2, 4, 8])
        rc = [rng.random() < 0.5 for _ in range(cost.num_blocks)]
        assert (
            cost.pass_memory_bytes(shapes, sp, rc) == fresh.breakdown(shapes, sp, rc).memory_bytes
        )
        sums = shape_sums(cost.spec.kinds, shapes)
        for kind, pairs in zip(cost.spec.kinds, sums.pairs):
            assert pairs == pytest.approx(sum(attention_pairs(kind, s) for s in shapes), rel=1e-12)
    for kind in ("full", "causal", "spatial", "temporal"):
        text = [SampleShape.text(t) for t in (1, 9, 4_000)]
        (pairs,) = shape_sums((kind,), text).pairs
        assert pairs == sum(attention_pairs(kind, s) for s in text)
    with pytest.raises(ValueError):
        cost.pass_memory_bytes([], 2, [False] * cost.num_blocks)


def test_a_run_of_fewer_ranks_per_node_prices_groups_across_its_nodes() -> None:
    """8 ranks on nodes of 4 (torchrun --nproc-per-node 4 on 8-GPU nodes): a group of 8
    crosses nodes and is priced over InfiniBand; a group of 4 stays inside one."""
    spec, h100 = get_model_spec("llama-7b"), get_hardware("h100-sxm")
    preset, eight = (analytic_model(spec, h100, world_size=8, ranks_per_node=n) for n in (None, 8))
    four = analytic_model(spec, h100, world_size=8, ranks_per_node=4)
    assert (preset.gpus_per_node, eight.gpus_per_node, four.gpus_per_node) == (8, 8, 4)
    shapes = [SampleShape.text(1 << 17)]
    assert eight.work(shapes, 8, ()).ib_bytes == 0 < four.work(shapes, 8, ()).ib_bytes
    assert four.pass_time_s(shapes, 8, ()) > eight.pass_time_s(shapes, 8, ())
    assert four.pass_time_s(shapes, 4, ()) == eight.pass_time_s(shapes, 4, ())
    assert four.grad_sync_time_s(8) > eight.grad_sync_time_s(8)
    # more ranks on a node than the preset's GPUs: the preset's node
    assert analytic_model(spec, h100, world_size=16, ranks_per_node=16).gpus_per_node == 8
