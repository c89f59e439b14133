"""The check before the ranks start prices and budgets the run on the device its ranks
compute on: local ranks of gloo (more ranks than GPUs) on the CPU, not the GPU one
process would take."""

from __future__ import annotations

import json

import pytest
import torch

from datacentric.cli.precheck import check_dataset, ranks_device


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine of one GPU, as torch tells it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize(
    ("device", "world", "expected"),
    [(None, None, "cuda"), ("cpu", None, "cpu"), (None, 1, "cuda"), (None, 2, "cpu")],
)
def test_the_ranks_device_is_where_the_launch_places_them(one_gpu, device, world, expected):
    assert ranks_device(device, world).type == expected


def test_two_ranks_on_one_gpu_are_checked_on_the_cpu(one_gpu, tmp_path, capsys):
    """Two local ranks on one GPU run gloo on the CPU; the check asked the GPU for its
    name and memory (here, torch without CUDA: 'Torch not compiled with CUDA enabled')."""
    from datacentric.settings import load_config

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * (10 + i)}) + "\n" for i in range(8)))
    settings = dict(model="llama", dataset=f"jsonl:{data}", world=2, cost_model="analytic")
    config = load_config(None, out=str(tmp_path / "run"), **settings)
    assert check_dataset(config, "train") is not None, capsys.readouterr().err
