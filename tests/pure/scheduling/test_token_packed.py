"""dcp-opt's own search forms token-packed steps (megatron-dyncp's micro-batches)."""

from __future__ import annotations

import numpy as np
import pytest

from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import dcp_opt
from datacentric.scheduling.measures import epoch_estimate_s
from datacentric.scheduling.pipeline import Pipeline
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape

#: name: (lengths, global batch tokens); seed 0, 8 H200s, llama-7b
SETS = {
    # reasoning traces: log-normal, median 6,000 tokens, at most 65,536
    "reasoning": (
        lambda rng: np.clip(rng.lognormal(np.log(6_000), 0.8, 600), 64, 65_536),
        2 * 2**20,
    ),
    # short chat turns: log-normal, median 180 tokens, at most 1,024
    "chat": (lambda rng: np.clip(rng.lognormal(np.log(180), 0.9, 6_000), 8, 1_024), 2**19),
}


@pytest.mark.parametrize("name", list(SETS))
def test_dcp_opt_own_steps_are_not_behind_megatron_dyncp(name, monkeypatch):
    """On reasoning traces and short chat turns at 8 GPUs megatron-dyncp's token-packed
    micro-batches (a CP group filled up to a per-rank token cap across buckets) ran
    steps shorter than dcp-opt's bucket-packed ones (the portfolio took them). dcp-opt's
    own search (no portfolio) now forms them too: no step of its own is behind
    megatron-dyncp's, its epoch neither, and with the portfolio no step is a peer's."""
    make, batch = SETS[name]
    lengths = make(np.random.default_rng(0)).astype(int)
    shapes = [SampleShape.text(int(n)) for n in lengths]
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=8)
    options = SchedulingConfig(global_batch_tokens=batch)

    def pipeline() -> Pipeline:
        return Pipeline(
            shapes, cost, world_size=8, memory_cap_bytes=98_700_000_000, options=options
        )

    ours = pipeline().schedule(0, policy="dcp-opt", measure=False)
    assert sum(ours.meta["settings"]["steps_from_peers"].values()) == 0
    ours.validate()
    monkeypatch.setattr(dcp_opt, "PORTFOLIO_SAMPLES", 0)
    pipe = pipeline()
    megatron = pipe.schedule(0, policy="megatron-dyncp", measure=False)
    own = pipe.schedule(0, policy="dcp-opt", measure=False)
    assert "steps_from_peers" not in own.meta["settings"]
    assert own.meta["settings"]["token_packed_steps"] > 0
    assert len(own.iterations) >= 2

    def seconds(it) -> float:
        return epoch_estimate_s([it], cost, shapes, 8)

    for mine, theirs in zip(own.iterations, megatron.iterations):
        assert seconds(mine) <= seconds(theirs) * (1 + 1e-9), mine.index
    total = epoch_estimate_s(own.iterations, cost, shapes, 8)
    assert total <= epoch_estimate_s(megatron.iterations, cost, shapes, 8) * (1 + 1e-9)


def test_megatron_finalists_pruned_by_bounds_are_the_fully_priced_best_three(monkeypatch):
    """megatron-dyncp's search stops pricing a candidate once its steps so far and the
    proved bounds of the rest exceed the third best's total: its finalists are still
    the three best of every candidate priced on every sampled step, with fewer steps
    built."""
    from test_scheduling_portfolio import _policy_input

    from datacentric.scheduling import megatron_dyncp, megatron_steps
    from datacentric.scheduling.search_steps import priced_steps

    lengths = SETS["reasoning"][0](np.random.default_rng(1)).astype(int)
    shapes = [SampleShape.text(int(n)) for n in lengths]
    cost = analytic_cost_model("llama-7b", "h200-sxm", world_size=8)
    options = SchedulingConfig(global_batch_tokens=2**20)
    pipe = Pipeline(shapes, cost, world_size=8, memory_cap_bytes=98_700_000_000, options=options)
    inp = _policy_input(pipe)
    chunks, _ = inp.global_batches()
    sample = priced_steps(len(chunks))
    every = []
    for name, allowed in megatron_dyncp.RECOMPUTATIONS.items():
        table = inp.table(name if name != "plan" else "pac", allowed)
        for cap in megatron_dyncp.cap_candidates(inp, table):
            try:
                steps = [
                    megatron_steps.build_steps(inp, table, cap, [chunks[k]], k)[0] for k in sample
                ]
            except ValueError:
                continue
            every.append((sum(it.est_makespan_s for it in steps), name, cap))
    best = [(name, cap) for _, name, cap in sorted(every)[: megatron_dyncp.FINALISTS]]
    built = []
    build = megatron_steps.build_steps  # patched where the search calls it
    monkeypatch.setattr(
        megatron_dyncp, "build_steps", lambda *a, **kw: built.append(a[4]) or build(*a, **kw)
    )
    found = megatron_dyncp.finalists(inp, {})
    assert [(name, cap) for name, _, cap in found] == best
    assert 0 < len(built) < len(every) * len(sample)  # the search built through the patch
