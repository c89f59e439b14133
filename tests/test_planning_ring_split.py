"""Hybrid Ulysses x ring groups in the cost model, the plan's options, the scheduler and
the simulator (the split lands in ``MicroBatch.ring_size``)."""

from __future__ import annotations

import json

import pytest

from datacentric.cli.main import main
from datacentric.planning.bucket_options import BucketOption, sp_size_tiers, split_candidates
from datacentric.planning.cost_model import split_breakdown
from datacentric.planning.planner import plan_buckets
from datacentric.profiling.factory import analytic_cost_model
from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule
from datacentric.shapes import SampleShape, make_buckets
from datacentric.sim.engine import simulate
from tests.toy_cost_model import ToyCostModel

FULL = (True,) * 32


@pytest.fixture(scope="module")
def llama():
    """llama-7b (32 heads) on 8-GPU H200 nodes."""
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def test_splits_reach_past_the_head_count_only_with_a_ring(llama):
    assert llama.supports_split(64, 2) and llama.supports_split(64, 64)
    assert not llama.supports_split(64, 1)  # 64 ranks cannot split 32 heads
    assert not llama.supports_split(16, 3)
    assert split_candidates(llama, 8) == [1]  # within a node: Ulysses alone
    assert split_candidates(llama, 16) == [1, 2, 16]  # Ulysses of 8 within each node
    assert split_candidates(llama, 64) == [8, 64]
    within, across = sp_size_tiers(llama, 64)
    assert across[-1] == 64
    with pytest.raises(ValueError, match="ring size 3"):
        split_breakdown(llama, [SampleShape.text(4096)], 64, FULL, 3)


def test_ring_steps_hide_behind_attention_on_long_sequences_only(llama):
    long, short = [SampleShape.text(1 << 20)], [SampleShape.text(4096)] * 8
    ring = split_breakdown(llama, long, 16, FULL, 16)
    ulysses = split_breakdown(llama, long, 16, FULL, 1)
    # 1M tokens: every K/V transfer hides behind its step's attention; the all-to-all
    # of a Ulysses group across two nodes does not
    assert ring.comm_s < 0.5 * ulysses.comm_s
    assert ring.time_s < ulysses.time_s
    # short sequences: the steps' compute is too small to hide 15 transfers
    assert (
        split_breakdown(llama, short, 16, FULL, 16).comm_s
        > split_breakdown(llama, short, 16, FULL, 1).comm_s
    )
    # the hybrid's all-to-all stays within a node (NVLink); rings cost more memory
    hybrid = split_breakdown(llama, long, 16, FULL, 2)
    assert hybrid.comm_s < ulysses.comm_s
    assert hybrid.memory_bytes > ulysses.memory_bytes


def test_a_model_without_rings_refuses_them():
    toy = ToyCostModel(capacity_bytes=16 * 2**20)
    shapes = [SampleShape.text(64)]
    with pytest.raises(ValueError, match="Ulysses-only"):
        split_breakdown(toy, shapes, 2, (False,) * toy.num_blocks, 2)
    assert split_candidates(toy, 2) == [1]


def test_the_plan_offers_rings_past_the_head_count_and_keeps_ulysses_where_it_is_cheaper(llama):
    shapes = [SampleShape.text(1 << 20), SampleShape.text(2048)]
    plan = plan_buckets(make_buckets(shapes), llama, world_size=64, memory_cap_bytes=100 * 2**30)
    options = [o for b in plan.buckets.values() for o in b.options]
    assert {o.sp_size for o in options if o.ring_size > 1} >= {64}
    assert all(o.ring_size == 1 for o in options if o.sp_size <= 8)
    short = plan.options_of(next(n for n, b in plan.buckets.items() if b.shape.tokens == 2048))
    assert all(o.ring_size == 1 for o in short if o.sp_size <= 32)  # short: no ring pays
    ringed = next(o for o in options if o.ring_size > 1)
    assert BucketOption.from_json(json.loads(json.dumps(ringed.to_json()))) == ringed


def test_the_simulator_prices_a_micro_batch_on_its_split(llama):
    shapes = [SampleShape.text(1 << 20)]
    timed = {}
    for ring in (2, 16):
        mb = MicroBatch((0,), "b", 1 << 20, recompute=FULL, ring_size=ring)
        schedule = Schedule(
            world_size=16,
            policy="by-hand",
            seed=0,
            epoch=0,
            num_samples=1,
            iterations=(Iteration(0, (Assignment(0, 16, (mb,)),)),),
            memory_cap_bytes=140 * 2**30,
        )
        result = simulate(schedule, shapes, llama, record_spans=False)
        timed[ring] = result.iterations[0].makespan_s
        assert timed[ring] == pytest.approx(split_breakdown(llama, shapes, 16, FULL, ring).time_s)
    assert timed[2] != timed[16]


def test_schedule_json_reports_ring_degrees_for_million_token_samples(tmp_path, capsys):
    lengths = [1 << 20] * 2 + [2048, 8192, 32768, 131072] * 40
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths)) + "\n")
    argv = ["schedule", "--lengths", str(path), "--world", "64", "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--policy", "dcp-opt", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples_scheduled"] == out["samples_total"] == len(lengths)
    assert any(r > 1 for _, r, _ in out["sp_splits"])
    assert sum(n for _, _, n in out["sp_splits"]) >= 1
