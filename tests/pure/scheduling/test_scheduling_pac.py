"""dcp-pac: PAC's knapsack per micro-batch, and the paper's policy near the bound."""

from __future__ import annotations

import pytest

from datacentric.planning.cost_model import split_breakdown
from datacentric.planning.planner import plan_buckets
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.item import Item
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import any_recompute
from datacentric.shapes import SampleShape, make_buckets

CAP = 98_700_000_000  # 70% of an H200's memory


@pytest.fixture(scope="module")
def llama():
    """llama-7b on 8-GPU H200 nodes."""
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def test_a_short_member_recomputes_what_it_needs(llama):
    lengths = [131_072, 70_000, 66_000, 100_000]
    shapes = [SampleShape.text(n) for n in lengths]
    plan = plan_buckets(make_buckets(shapes), llama, world_size=8, memory_cap_bytes=CAP)
    view = DatasetView(shapes)
    tables = [
        OptionTable(view, llama, plan, world_size=8, max_sp_size=None, allowed=any_recompute, **kw)
        for kw in ({}, {"per_micro_batch": True})
    ]
    by_bucket, per_member = tables
    b = int(view.bucket_of[1])
    assert int(view.bucket_of[0]) == b  # one bucket, planned on 131,072 tokens
    saved = 0
    for i in (1, 2, 3):
        item = Item(b, [i], lengths[i])
        for sp in (1, 2, 4):
            cfg, seconds = per_member.item_option(item, sp)  # the split that runs it fastest
            if cfg is None:
                continue
            rc = per_member.micro_batch_recompute(item, sp, cfg)
            own = split_breakdown(llama, [shapes[i]], sp, rc, cfg.ring_size)
            assert own.memory_bytes <= CAP
            assert seconds <= by_bucket.item_time(item, sp)
            assert seconds == pytest.approx(own.time_s)
            saved += sum(cfg.recompute) - sum(rc)
    assert saved > 0  # some member recomputes fewer blocks than the representative
