"""Hybrid Ulysses x ring groups in the cost model, the plan's options, the scheduler and
the simulator (the split lands in ``MicroBatch.ring_size``)."""

from __future__ import annotations

import json

import pytest
from toy_cost_model import ToyCostModel

from datacentric.planning.bucket_options import BucketOption, sp_size_tiers, split_candidates
from datacentric.planning.cost_model import split_breakdown
from datacentric.planning.planner import plan_buckets
from datacentric.profiling.factory import analytic_cost_model
from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.shapes import SampleShape, make_buckets
from datacentric.sim.engine import simulate

FULL = (True,) * 32


@pytest.fixture(scope="module")
def llama():
    """llama-7b (32 heads) on 8-GPU H200 nodes."""
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def test_splits_reach_past_the_head_count_only_with_a_ring(llama):
    assert llama.supports_split(64, 2) and llama.supports_split(64, 64)
    assert not llama.supports_split(64, 1)  # 64 ranks cannot split 32 heads
    assert not llama.supports_split(16, 3)
    assert split_candidates(llama, 8) == [1, 8]  # within a node: Ulysses, or a ring
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
    # 1M tokens: the K/V transfers hide behind their steps' attention (the gradients'
    # last send home does not); the all-to-all of a Ulysses group across nodes does not
    assert ring.comm_s < ulysses.comm_s
    assert ring.time_s < ulysses.time_s
    # short sequences: the steps' compute is too small to hide 15 transfers
    assert (
        split_breakdown(llama, short, 16, FULL, 16).comm_s
        > split_breakdown(llama, short, 16, FULL, 1).comm_s
    )
    # on 4 nodes, Ulysses of 8 within each node and a ring of 4 across beat an
    # all-to-all over 32 ranks; the ring's buffers cost memory
    hybrid = split_breakdown(llama, long, 32, FULL, 4)
    wide = split_breakdown(llama, long, 32, FULL, 1)
    assert hybrid.comm_s < wide.comm_s and hybrid.time_s < wide.time_s
    assert hybrid.memory_bytes > wide.memory_bytes


def test_a_model_without_rings_refuses_them():
    toy = ToyCostModel(capacity_bytes=16 * 2**20)
    shapes = [SampleShape.text(64)]
    with pytest.raises(ValueError, match="Ulysses-only"):
        split_breakdown(toy, shapes, 2, (False,) * toy.num_blocks, 2)
    assert split_candidates(toy, 2) == [1]


#: 768K tokens: the longest multiple of 256K tokens whose pass, split 8 ways, fits
#: one node under a 100 GiB budget (94.8 GiB with a ring of 8 and full recomputation, 35.2 of
#: them the loss head); 1M tokens need 117.5 GiB there and fit no node size
NODE_LONG = 3 << 18


def test_the_plan_offers_rings_past_the_head_count_and_keeps_ulysses_where_it_is_cheaper(llama):
    shapes = [SampleShape.text(NODE_LONG), SampleShape.text(2048)]
    plan = plan_buckets(make_buckets(shapes), llama, world_size=64, memory_cap_bytes=100 * 2**30)
    options = [o for b in plan.buckets.values() for o in b.options]
    assert {o.sp_size for o in options if o.ring_size > 1} >= {64}
    short = plan.options_of(next(n for n, b in plan.buckets.items() if b.shape.tokens == 2048))
    assert all(o.ring_size == 1 for o in short if o.sp_size <= 32)  # short: no ring pays
    long = next(n for n, b in plan.buckets.items() if b.shape.tokens == NODE_LONG)
    # 768K tokens inside a node: a ring over the 8 GPUs hides its transfers, Ulysses'
    # all-to-alls do not, so the plan takes the ring there
    inside = [o for o in plan.options_of(long) if o.sp_size == 8]
    assert inside and all(o.ring_size == 8 for o in inside)
    for o in inside:
        ulysses = split_breakdown(llama, [SampleShape.text(NODE_LONG)], 8, o.recompute, 1)
        assert o.times[0] < ulysses.time_s
    best = plan.preferred(long)
    row = plan.bucket_row(long, llama)
    assert row.get("ring", 1) == best.ring_size and row["sp_size"] == best.sp_size
    assert row["est_memory_bytes"] <= plan.memory_cap_bytes
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


def test_split_modes_limit_the_plan_to_one_kind_of_split(llama):
    from datacentric.planning.split_modes import SplitLimitedCostModel

    shapes = [SampleShape.text(1 << 20), SampleShape.text(8192)]
    buckets = make_buckets(shapes)
    cap = 100 * 2**30
    ulysses = plan_buckets(
        buckets, SplitLimitedCostModel(llama, "ulysses"), world_size=64, memory_cap_bytes=cap
    )
    ring = plan_buckets(
        buckets, SplitLimitedCostModel(llama, "ring"), world_size=64, memory_cap_bytes=cap
    )
    u_opts = [o for b in ulysses.buckets.values() for o in b.options]
    r_opts = [o for b in ring.buckets.values() for o in b.options]
    assert all(o.ring_size == 1 for o in u_opts) and max(o.sp_size for o in u_opts) == 32
    assert all(o.ring_size == o.sp_size for o in r_opts) and max(o.sp_size for o in r_opts) == 64
    limited = SplitLimitedCostModel(llama, "ring")
    # asked by SP size alone, a ring-CP group is priced as its ring
    assert limited.breakdown(shapes[:1], 16, FULL) == split_breakdown(
        llama, shapes[:1], 16, FULL, 16
    )
    with pytest.raises(ValueError, match="split mode"):
        SplitLimitedCostModel(llama, "zigzag")


def test_the_long_context_preset_reaches_a_million_tokens():
    from datacentric.data.workloads import get_workload

    tokens = [s.tokens for s in get_workload("longctx-1m", num_samples=500).shapes]
    assert len(tokens) == 500 and min(tokens) >= 8192 and max(tokens) <= 1 << 20
    assert max(tokens) > 900_000
    assert tokens == [s.tokens for s in get_workload("longctx-1m", num_samples=500).shapes]


def test_the_ideal_bound_prices_ring_options_past_a_node(llama):
    import numpy as np

    from datacentric.scheduling import Pipeline
    from datacentric.scheduling.measures import sample_gpu_seconds
    from datacentric.scheduling.option_table import OptionTable
    from datacentric.scheduling.policy_input import any_recompute

    for tokens in (NODE_LONG, 1 << 20):  # one node holds 768K tokens, no node holds 1M
        shapes = [SampleShape.text(tokens), SampleShape.text(8192)]
        plan = Pipeline(shapes, llama, world_size=256, memory_cap_bytes=100 * 2**30).plan
        table = OptionTable(
            DatasetView(shapes),
            llama,
            plan,
            world_size=256,
            max_sp_size=None,
            allowed=any_recompute,
        )
        b = int(table.view.bucket_of[0])
        fits = [c.gpu_seconds_per_sample for s in table.node_sizes if (c := table.config(b, s))]
        assert table.ring_sizes_past_node(b)
        ideal = sample_gpu_seconds(table, np.asarray([0]))[0]
        if tokens == NODE_LONG:  # a ring past a node costs fewer GPU-seconds than any node size
            assert fits and ideal < min(fits)
        else:  # only rings past a node hold it, and they price it
            assert not fits and 0 < ideal < np.inf


def test_ring_transfer_hides_behind_only_its_overlap_share_of_attention():
    from dataclasses import replace

    from datacentric.planning.hardware import get_hardware

    base = get_hardware("h200-sxm")
    assert base.ring_overlap == 0.8  # conservative by default
    with pytest.raises(ValueError, match="ring_overlap"):
        replace(base, ring_overlap=1.5)
    shape = [SampleShape.text(131_072)]
    times = {}
    for overlap in (0.0, 0.8, 1.0):
        cost = analytic_cost_model("llama-7b", replace(base, ring_overlap=overlap), world_size=64)
        times[overlap] = split_breakdown(cost, shape, 16, FULL, 16).time_s
    assert times[0.0] > times[0.8] > times[1.0]


def test_ring_traffic_across_nodes_shares_the_link_with_the_hidden_sync(llama):
    from datacentric.scheduling.measures import backward_s

    shape = [SampleShape.text(131_072)]
    across = split_breakdown(llama, shape, 16, FULL, 16)
    within = split_breakdown(llama, [SampleShape.text(65_536)], 8, FULL, 1)
    assert within.inter_node_backward_s == 0.0
    assert 0.0 < across.inter_node_backward_s < across.time_s
    whole = across.time_s - (across.time_s - across.recompute_s) / 3
    assert backward_s(across) == pytest.approx(whole - across.inter_node_backward_s)


def test_a_rings_memory_asked_alone_is_its_breakdowns():
    """``pass_memory_bytes`` on a ring answers without the time formula
    (``compute_split_memory_bytes``): exactly the breakdown's bytes, and a split the
    ring that does not divide the group is refused as the breakdown refuses it."""
    import numpy as np

    from datacentric.planning.bucket_options import accepted_splits

    fresh = analytic_cost_model("llama-7b", "h200-sxm", world_size=64)  # empty caches
    rng = np.random.default_rng(0)
    asked = []
    for _ in range(60):
        sp = int(rng.choice([2, 4, 8, 16, 64]))
        ring = int(rng.choice([r for r in accepted_splits(fresh, sp) if r > 1]))
        shapes = [SampleShape.text(int(n)) for n in rng.integers(1, 300_000, rng.integers(1, 6))]
        flags = tuple(bool(x) for x in rng.integers(2, size=32))
        memory = fresh.pass_memory_bytes(shapes, sp, flags, ring_size=ring)
        asked.append((shapes, sp, flags, ring, memory))
    for shapes, sp, flags, ring, memory in asked:
        assert memory == split_breakdown(fresh, shapes, sp, flags, ring).memory_bytes
    with pytest.raises(ValueError, match="does not divide"):
        fresh.pass_memory_bytes([SampleShape.text(64)], 64, FULL, ring_size=3)
