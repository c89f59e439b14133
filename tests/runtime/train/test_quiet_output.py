"""Quiet by default: a LoRA fine-tune of an ``hf:DIR`` folder prints no third-party
progress bar and one line naming what it trains (and the tokenizer it reads text with);
``--verbose`` (``DATACENTRIC_VERBOSE=1``) lets the libraries' bars and the profiler's
lines through."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from chat_data import WORDS, save_chat_tokenizer, tiny_qwen2_config, write_records
from cli_here import cli_here
from repo_paths import ROOT

from datacentric.log import QUIET_ENV, VERBOSE_ENV
from datacentric.train.build import what_trains

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_what_trains_names_full_and_lora_runs() -> None:
    from datacentric.models.lora import apply_lora
    from datacentric.models.lora_settings import LoraSpec

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    assert what_trains(model) == "trains all 23 parameters (full)"
    model[0].weight.requires_grad_(False)
    assert what_trains(model, "bytes") == (
        "trains 11 of 23 parameters (47.8%); reads text with tokenizer bytes"
    )
    model = apply_lora(torch.nn.Sequential(torch.nn.Linear(4, 3)), LoraSpec(rank=2, targets=("0",)))
    # A: 2x4, B: 3x2 on a 15-parameter layer
    assert what_trains(model) == "trains LoRA rank 2 on 0: 14 of 29 parameters (48.3%)"


def test_a_lora_fine_tune_is_quiet_and_names_what_it_trains(tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    for name in QUIET_ENV:  # as a user's shell has them: unset
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "qwen"
    save_chat_tokenizer(folder)
    AutoModelForCausalLM.from_config(tiny_qwen2_config(320)).save_pretrained(folder)
    data = write_records(tmp_path / "docs.jsonl", [{"text": WORDS}] * 4)
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}"]
    argv += ["--lora.rank", "2", "--iterations", "1", "--cost-model", "analytic"]
    argv += ["--no-plots", "--no-tensorboard", "--out", str(tmp_path / "run")]
    capsys.readouterr()  # the folder's own save (its "Writing model shards" bar)
    status, _, err = cli_here(argv, capsys)
    assert status == 0, err[-3000:]
    assert "Loading weights" not in err and "it/s" not in err and "%|" not in err, err
    model = AutoModelForCausalLM.from_pretrained(folder)
    total = sum(p.numel() for p in model.parameters())
    # rank 2 on 2 layers: A (2 x in) and B (out x 2) on q, o (32->32) and k, v (32->16)
    lora = 2 * (2 * (2 * 32 + 32 * 2) + 2 * (2 * 32 + 16 * 2))
    targets = "q_proj,k_proj,v_proj,o_proj"
    line = f"trains LoRA rank 2 on {targets}: {lora:,} of {total + lora:,} parameters"
    assert sum(line in ln for ln in err.splitlines()) == 1, err[-3000:]
    assert f"reads text with tokenizer {folder}" in err


#: The switches the ranks inherit, and the profiler's lines, in a process of their own
#: (the profiler reads its switch once).
NOISY = """
    import os, torch
    from datacentric.log import quiet_third_party
    quiet_third_party()
    print("bars", os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(2) @ torch.ones(2)
"""


@pytest.mark.parametrize("verbose", ["0", "1"])
def test_verbose_lets_third_party_output_through(verbose: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}
    env.update({VERBOSE_ENV: verbose, "PYTHONPATH": str(ROOT)})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOISY)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loud = verbose == "1"
    assert done.stdout.split() == ["bars", "None" if loud else "1"], done.stdout
    assert ("USDT" in done.stderr) == loud, done.stderr
