"""A torch.profiler trace of a step names its micro-batches, all-to-alls, ring steps and
gradient sync (read back from the written Chrome trace)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.annotate import PREFIX, annotate, micro_batch_name
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.shapes import SampleShape

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCKS = 2


def _traced_step(folder: str) -> list[str]:
    groups = ProcessGroups()
    torch.manual_seed(0)
    model = build_model("llama", num_layers=BLOCKS)
    dataset = SyntheticTextDataset([SampleShape.text(n) for n in (24, 16, 12)])
    runtime = DataCentricRuntime(model, groups, dataset.pack, loss_tokens_function(dataset))
    micro = (
        MicroBatch((0,), "b", 24, recompute=(True, False), ring_size=2),
        MicroBatch((1, 2), "b", 28, ring_size=1),
    )
    iteration = Iteration(0, (Assignment(rank_start=0, sp_size=2, micro_batches=micro),))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_step(runtime, iteration)
    path = Path(folder) / f"rank{groups.rank}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith(PREFIX)})


@pytest.mark.slow
def test_a_step_trace_names_the_schedule(tmp_path):
    names = spawn(_traced_step, 2, str(tmp_path), timeout_s=120)[0]
    micro = [n for n in names if " micro-batch " in n]
    assert len(micro) == 2, names
    first = next(n for n in micro if "micro-batch 1/2" in n)
    assert re.search(r"sp 2 \(ulysses 1 x ring 2\) \| 1 samples, 24 tokens \(12 on", first)
    assert first.endswith("recompute 1/2 blocks")
    second = next(n for n in micro if "micro-batch 2/2" in n)
    assert "sp 2 (ulysses 2 x ring 1) | 2 samples, 28 tokens (14 on this rank)" in second
    assert any(n.startswith(PREFIX + "all-to-all sp 2 ") for n in names), names
    for way in ("forward", "backward"):
        assert {PREFIX + f"ring step {k}/2 {way}" for k in (1, 2)} <= set(names), names
    assert PREFIX + "gradient sync: all-reduce over 2 ranks" in names
    assert PREFIX + "gather losses and timings" in names


def test_no_range_outside_a_profiler():
    assert type(annotate("x")).__name__ == "nullcontext"
    name = micro_batch_name(
        0, 1, sp_size=4, ring_size=2, samples=3, tokens=64, local_tokens=16, recomputed=0,
        blocks=8, sync="grad sync in backward (FSDP2)",
    )  # fmt: skip
    assert name == (
        "micro-batch 1/1 sp 4 (ulysses 2 x ring 2) | 3 samples, 64 tokens (16 on this rank) | "
        "recompute 0/8 blocks | grad sync in backward (FSDP2)"
    )
