"""The commands that only price a model (``plan``, ``schedule``, ``simulate``) run
without torch on a workload preset and a preset model: importing torch was about a sixth
of ``schedule``'s CPU time. (With ``--lora.rank`` they import it: the adapters' count is
read from the model built on the meta device.) These tests run with ``import torch``
failing (tests/no_torch.py), so any path that imports it fails them."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest

from datacentric.cli.main import main

DATA = ["--dataset", "sft-longtail", "--dataset-limit", "300", "--world", "8"]


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", *DATA, "--policy", "dcp-opt", "--json"],
        ["schedule", *DATA, "--policy", "static", "--max-sp-size", "4", "--json"],
        ["plan", *DATA, "--model", "llama-7b", "--hardware", "h200-sxm", "--json"],
        ["simulate", *DATA, "--policies", "dcp-opt,static", "--json"],
    ],
    ids=["schedule", "schedule-max-sp", "plan", "simulate"],
)
def test_a_pricing_command_runs_without_torch(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    assert json.loads(out.getvalue().strip().splitlines()[-1])
    assert "torch" not in sys.modules
