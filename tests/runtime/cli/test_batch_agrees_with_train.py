"""``schedule`` and ``simulate`` size the global batch as ``train`` does when none is
given, so that they count the steps ``train`` runs on the same data and world."""

from __future__ import annotations

import json

import pytest
from cli_here import cli_json_here

from datacentric.cli.precheck import check_dataset
from datacentric.scheduling.global_batches import steps_per_epoch
from datacentric.settings import load_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("world", [1, 2])
def test_schedule_and_simulate_count_train_s_steps(world, tmp_path, capsys):
    words = "the cat walks on grass under a blue sky while birds fly".split()
    rows = [" ".join(words[(i + k) % len(words)] for k in range(20 + 13 * i)) for i in range(24)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows), encoding="utf-8")
    dataset = f"jsonl:{data}"
    config = load_config(None, model="llama", dataset=dataset, world=world, out=str(tmp_path))
    prechecked = check_dataset(config, "train")
    assert prechecked is not None
    sized = prechecked.global_batch.applied(config.scheduling)
    assert sized.global_batch_tokens is not None  # a small dataset: train sizes its batch
    shapes = prechecked.data[0].shapes()
    trains = steps_per_epoch(shapes, sized, seed=0, world_size=world)
    assert trains > 1  # the default global batch (world x 2**18 tokens) is one step
    common = ["--dataset", dataset, "--world", str(world), "--model", "llama"]
    common += ["--hardware", "cpu-local", "--policy", "dcp-opt", "--json"]
    scheduled = cli_json_here(["schedule", *common], capsys)
    assert scheduled["iterations"] == trains
    simulated = cli_json_here(["simulate", *common], capsys)
    assert simulated["steps"] == trains
    assert f"{sized.global_batch_tokens} tokens" in simulated["steps_why"]
