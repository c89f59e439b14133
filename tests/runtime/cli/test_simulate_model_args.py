"""``datacentric simulate`` prices the model its ``--model-arg`` flags describe, as
``schedule`` and ``train`` do: it read them and simulated the model's defaults."""

from __future__ import annotations

import json

from datacentric.cli.main import main

MODEL = ["--model", "tests.user_models:tiny_gpt", "--world", "4"]
DATA = ["--dataset", "stdlib", "--dataset-limit", "3", "--max-tokens", "256"]


def _run(capsys, command: str, *flags: str) -> dict:
    assert main([command, *DATA, *MODEL, "--policy", "static", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_prices_the_model_its_model_args_describe(capsys):
    """A 3-head model at world 4 runs SP 1 only, so the global batch train sizes covers
    4 samples a step (5 steps an epoch): simulate sized it for the default 2 heads (8
    steps), and a model 16 times wider, 4 times deeper took the same time."""
    three = ["--model-arg", "heads=3", "--model-arg", "width=48"]
    steps = _run(capsys, "schedule", *three)["iterations"]
    simulated = _run(capsys, "simulate", *three)["policies"]["static"]
    assert simulated["iterations"] == steps == 5
    base = _run(capsys, "simulate")["policies"]["static"]
    wide = _run(capsys, "simulate", "--model-arg", "width=512", "--model-arg", "layers=8")
    assert base["iterations"] == 8
    assert wide["policies"]["static"]["epoch_time_s"] > 2 * base["epoch_time_s"]
