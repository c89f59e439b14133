"""Frozen parameters (LoRA's base) priced right: gradients, optimizer state, weight
gradients and the gradient sync only for the parameters that train."""

from __future__ import annotations

from dataclasses import replace

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.hardware import get_hardware
from datacentric.planning.planner import plan_buckets
from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.factory import get_model_spec
from datacentric.shapes import Bucket, SampleShape

#: LoRA of rank 16 on q, k, v, o of llama-7b: 4 x 2 x 4096 x 16 per block, 32 blocks.
LORA_PARAMS = 32 * 4 * 2 * 4096 * 16


def _models(world: int = 8, shard: str = "ddp"):
    spec = get_model_spec("llama-7b")
    kw = dict(sharding=ShardingSpec(shard), world_size=world)
    full = AnalyticCostModel(spec, get_hardware("h200-sxm"), **kw)
    lora = AnalyticCostModel(
        replace(spec, trainable_params=LORA_PARAMS), get_hardware("h200-sxm"), **kw
    )
    return full, lora


def test_frozen_weights_hold_no_gradient_or_optimizer_state() -> None:
    full, lora = _models()
    n, b = full.spec.num_params, full.dtype_bytes
    assert full.model_state_bytes() == n * (b + full.grad_bytes + full.optimizer_bytes_per_param)
    trained = LORA_PARAMS * (lora.grad_bytes + lora.optimizer_bytes_per_param)
    assert lora.model_state_bytes() == n * b + trained
    assert full.spec.trained_params == n and full.spec.weight_grad_share == 1.0
    for shard in ("fsdp2", "none"):
        a, c = _models(shard=shard)
        assert c.model_state_bytes() < a.model_state_bytes()


def test_frozen_weights_skip_the_weight_gradient_and_its_sync() -> None:
    full, lora = _models()
    shapes = [SampleShape.text(8192)]
    assert lora.grad_sync_time_s(8) < full.grad_sync_time_s(8) / 100
    f, l_ = full.breakdown(shapes, 1, ()), lora.breakdown(shapes, 1, ())
    # a frozen matmul's backward is one matmul (the input's gradient), not two
    assert 0.6 < l_.compute_s / f.compute_s < 0.9
    assert l_.memory_bytes < f.memory_bytes


def _recomputed_blocks(cost, budget):
    buckets = [Bucket(f"t{n}", SampleShape.text(n)) for n in (16384, 32768)]
    plan = plan_buckets(buckets, cost, world_size=8, memory_cap_bytes=budget, sp_sizes=[1])
    return {b: sum(plan.preferred(b).recompute or ()) for b in plan.buckets}


def test_at_a_budget_where_full_training_recomputes_lora_recomputes_less() -> None:
    full, lora = _models(shard="fsdp2")
    budget = 140 * 2**30 * 7 // 10  # 70% of an H200
    full_blocks, lora_blocks = _recomputed_blocks(full, budget), _recomputed_blocks(lora, budget)
    assert sum(full_blocks.values()) > 0, "the fully trained model must recompute here"
    assert sum(lora_blocks.values()) < sum(full_blocks.values())
    assert all(lora_blocks[b] <= full_blocks[b] for b in full_blocks)
