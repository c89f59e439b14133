"""The public API, the examples, and the side-by-side policy comparison."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import ROOT
from run_config import small_config

from datacentric.cli.comparison_report import bench_summary
from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.loss import loss_tokens_function
from datacentric.train.comparison.measured_comparison import compare_policies
from datacentric.train.data_centric import DataCentric

pytestmark = pytest.mark.usefixtures("one_thread")


def test_example_diff_is_at_most_ten_lines():
    plain = (ROOT / "examples/train_plain.py").read_text().splitlines()
    dcp = (ROOT / "examples/train_datacentric.py").read_text().splitlines()
    import difflib

    changed = [
        line
        for line in difflib.unified_diff(plain, dcp, lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert 0 < len(changed) <= 10, changed


def test_user_loop_step_equals_one_process_gradient():
    """A step of the user-written loop gives the global batch's mean gradient."""
    torch.manual_seed(0)
    dataset = StdlibCorpus(max_tokens=256, limit=1)
    model = build_model("llama")
    reference = build_model("llama")
    reference.load_state_dict(model.state_dict())
    dc = DataCentric(
        model,
        dataset,
        preset="llama",
        policy="dcp-opt",
        tokens_per_iteration=2048,
        groups=ProcessGroups.local(),
    )
    step = next(iter(dc.steps()))
    micro_count = 0
    for micro in step:
        micro.backward(model(micro.batch))
        micro_count += 1
    loss = step.finish()
    ids = step.sample_ids
    batch = dataset.pack(ids)
    ref_loss = reference(batch).sum() / sum(loss_tokens_function(dataset)(i) for i in ids)
    ref_loss.backward()
    assert micro_count >= 1
    torch.testing.assert_close(torch.tensor(loss), ref_loss.detach().double().float())
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_steps_call_with_no_step_left_is_refused_naming_the_limits():
    """``for epoch in range(2): for step in dc.steps(): ...`` trained its second epoch with
    no step and no word (``steps()``' limits count from the run's start): refused now."""
    from user_models import tiny_gpt

    from datacentric.data import SyntheticTextDataset
    from datacentric.shapes import SampleShape

    torch.manual_seed(0)
    dataset = SyntheticTextDataset([SampleShape(n) for n in (9, 14, 6, 20)])
    dc = DataCentric(
        tiny_gpt(width=16), dataset, tokens_per_iteration=32, groups=ProcessGroups.local()
    )
    ran = []
    for epoch in range(2):
        if epoch == 1:
            with pytest.raises(ValueError, match=r"steps\(epochs=1, iterations=None\) has no "):
                next(dc.steps())
        for step in dc.steps(epochs=epoch + 1):  # the way the line says
            for micro in step:
                micro.backward(dc.model(micro.batch))
            step.finish()
            ran.append(step.epoch)
    dc.close()
    assert ran and ran.count(1) == ran.count(0)


def _example_losses(name: str, model: str, capsys, monkeypatch) -> list[float]:
    """The losses ``python examples/NAME MODEL`` prints. Our Llama's data-centric example
    runs as that command (a fresh interpreter, the public API only); the others run in
    this process, which has torch, transformers and diffusers imported already."""
    path = ROOT / "examples" / name
    if model == "llama" and name == "train_datacentric.py":
        env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread, as a rank has
        done = subprocess.run(
            [sys.executable, str(path), model], capture_output=True, text=True, timeout=600, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        stdout = done.stdout
    else:
        capsys.readouterr()
        with monkeypatch.context() as patch:
            patch.setattr(sys, "argv", [str(path), model])
            runpy.run_path(str(path), run_name="__main__")
        stdout = capsys.readouterr().out
    return [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step")]


@pytest.mark.parametrize("model", ["llama", "hf:qwen2", "diffusers:wan"])
def test_plain_and_datacentric_examples_run(model: str, capsys, monkeypatch):
    """The same ten-line diff trains our Llama, an unmodified transformers model and an
    unmodified diffusers model (no adapter class written for either), built with the
    public API only."""
    pytest.importorskip("transformers" if model.startswith("hf:") else "torch")
    pytest.importorskip("diffusers" if model.startswith("diffusers:") else "torch")
    for name in ("train_plain.py", "train_datacentric.py"):
        losses = _example_losses(name, model, capsys, monkeypatch)
        assert len(losses) >= 2 and losses[-1] < losses[0], (name, losses)


@pytest.mark.slow
def test_compare_policies_measures_and_simulates_the_same_epoch(tmp_path):
    base = small_config(tmp_path, dataset_limit=1, max_tokens=512, tokens_per_iteration=2048)
    comparison = compare_policies(base, ["static", "dcp-opt"], 2, tmp_path, repeats=1)
    results = {p: r.first for p, r in comparison.policies.items()}
    samples = len(StdlibCorpus(max_tokens=512, limit=1))
    for r in results.values():
        assert r.measured.samples == samples
        assert r.predicted.samples == samples
        assert r.tokens == r.measured.tokens == r.predicted.tokens
        assert r.measured_s > 0 and r.predicted_s > 0
        passes = [
            {(s.micro_batch, s.rank) for s in result.spans if s.micro_batch is not None}
            for result in (r.measured, r.predicted)
        ]
        assert passes[0] == passes[1] and passes[0]
        assert r.measured.micro_batches.keys() == r.predicted.micro_batches.keys()
        assert (Path(tmp_path) / r.policy / "schedules" / "epoch-0.json").exists()
    summary = bench_summary(comparison, "static")
    assert set(summary["policies"]) == {"static", "dcp-opt"}
    assert summary["best_policy"] == "dcp-opt"
    assert summary["speedup"] == pytest.approx(
        results["dcp-opt"].tokens_per_s / results["static"].tokens_per_s
    )


def test_the_default_cost_model_prices_the_ranks_own_nodes():
    """``DataCentric(model, dataset)`` without a cost model priced its groups on the
    preset's node (``cpu-local``: 2 ranks) whatever the ranks' layout: a group of 2 on
    nodes of 1 rank (torchrun ``--nproc-per-node 1`` on two machines) was priced as inside
    a node. It now takes the process groups' ranks per node, as ``train`` does."""
    from user_models import tiny_gpt

    from datacentric.data import SyntheticTextDataset
    from datacentric.planning.hardware import get_hardware
    from datacentric.shapes import SampleShape

    groups = ProcessGroups.local()
    assert groups.ranks_per_node == 1 < get_hardware("cpu-local").gpus_per_node
    dataset = SyntheticTextDataset([SampleShape(n) for n in (9, 14, 6, 20)])
    dc = DataCentric(tiny_gpt(width=16), dataset, tokens_per_iteration=32, groups=groups)
    dc.close()
    assert dc.pipeline.cost_model.gpus_per_node == 1


def test_a_dtype_the_cost_model_does_not_know_is_refused_naming_the_two():
    """``DataCentric(..., dtype="bf16")`` (transformers' word) was priced as float32
    without a word: the analytic model read any dtype but ``bfloat16`` as 4 bytes. It is
    refused now, naming the two it knows; ``bfloat16`` prices 2-byte activations."""
    from user_models import tiny_gpt

    from datacentric.data import SyntheticTextDataset
    from datacentric.shapes import SampleShape

    dataset = SyntheticTextDataset([SampleShape(n) for n in (9, 14, 6, 20)])
    with pytest.raises(ValueError, match=r"dtype 'bf16'.*float32 or bfloat16"):
        DataCentric(tiny_gpt(width=16), dataset, dtype="bf16", groups=ProcessGroups.local())
    dc = DataCentric(tiny_gpt(width=16), dataset, dtype="bfloat16", groups=ProcessGroups.local())
    dc.close()
    assert dc.pipeline.cost_model.dtype_bytes == 2
