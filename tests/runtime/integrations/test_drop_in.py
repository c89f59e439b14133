"""The drop-in ``SFTTrainer`` and ``Trainer`` against TRL's and transformers' own.

One script (``sft_script.py``: the TRL quickstart pattern against a tiny Qwen2 folder
with a chat template, a tokenizer trained here) runs twice with only its import
changed: TRL's ``SFTTrainer`` / transformers' ``Trainer`` in one process with a batch of
4 samples, and the drop-ins under ``torchrun --nproc-per-node 2`` with 2 per rank, the
same global batch. Each dataset is 4 samples over 2 epochs (2 steps, each the whole
set, so the data order does not matter), 4 held-out ones (in eval batches of 4 in one
process and of 2 a rank on two: one round of them either way); the text run also under
``accelerate launch`` with 2 processes. The losses logged at steps 1
and 2 and ``eval_loss`` must agree within 1e-5 relative for text, conversational
(assistant-only) and prompt-completion data and a tokenized dataset with labels -100;
the LoRA run must call every callback and save an adapter peft loads; no process
prints transformers' advice to launch with ``torch.distributed.launch``. TRL's logged
``num_tokens`` (equal), ``mean_token_accuracy`` and ``entropy`` (1e-5) must agree at every
step for the SFT kinds, and for the LoRA quickstart (4 steps, some predictions right)
also in one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

SCRIPT = Path(__file__).with_name("sft_script.py")
TESTS = Path(__file__).resolve().parents[2]
EVENTS = ("on_train_begin", "on_step_end", "on_log", "on_evaluate", "on_save", "on_train_end")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny Qwen2 saved from its config, with a trained chat tokenizer."""
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _start(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", DATACENTRIC_CACHE=str(tmp_path / "cache"))
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _results(process: subprocess.Popen) -> dict[str, dict]:
    """Each kind's result; a launcher's advice from transformers on stderr fails."""
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-4000:]
    assert "torch.distributed.launch" not in err, err[-4000:]
    lines = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    return {r["kind"]: r for r in lines}


def _same_token_metrics(have: dict, want: dict) -> None:
    """TRL's per-step ``num_tokens``, ``mean_token_accuracy`` and ``entropy`` agree."""
    assert len(have["token_metrics"]) == len(want["token_metrics"]), (have, want)
    for ours, theirs in zip(have["token_metrics"], want["token_metrics"], strict=True):
        assert set(ours) == set(theirs) == {"num_tokens", "mean_token_accuracy", "entropy"}
        assert ours["num_tokens"] == theirs["num_tokens"], (ours, theirs)
        for name in ("mean_token_accuracy", "entropy"):
            assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), (ours, theirs)


def test_drop_ins_under_torchrun_equal_trl_and_transformers(model_folder, tmp_path) -> None:
    kinds = "text,chat,prompt,tokens"
    reference = _start(
        [sys.executable, str(SCRIPT), str(model_folder), str(tmp_path), "trl", kinds + ",lora"],
        tmp_path,
    )
    alone = _start(
        [sys.executable, str(SCRIPT), str(model_folder), str(tmp_path / "one"), "datacentric"]
        + ["lora"],
        tmp_path,
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    ours = _start(
        [*torchrun, str(SCRIPT), str(model_folder), str(tmp_path), "datacentric", kinds + ",lora"],
        tmp_path,
    )
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
    accelerate += ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    accelerate += ["--dynamo_backend", "no", "--main_process_port", "0"]
    by_accelerate = _start(
        [*accelerate, str(SCRIPT), str(model_folder), str(tmp_path / "acc"), "datacentric", "text"],
        tmp_path,
    )
    expected, got = _results(reference), _results(ours)
    quickstart, want = got["lora"], expected["lora"]
    assert max(m["mean_token_accuracy"] for m in want["token_metrics"]) > 0.1, want
    for have in (quickstart, _results(alone)["lora"]):  # 2 processes, then 1
        assert have["losses"] == pytest.approx(want["losses"], rel=1e-5), (have, want)
        _same_token_metrics(have, want)
    # accelerate launch (its torchrun environment): the same numbers
    launched = _results(by_accelerate)["text"]
    for a, b in zip(launched["losses"], expected["text"]["losses"][:2], strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    for kind in kinds.split(","):
        want, have = expected[kind], got[kind]
        assert len(have["losses"]) == 2, have
        for a, b in zip(have["losses"], want["losses"][:2], strict=True):
            assert a == pytest.approx(b, rel=1e-5), (kind, have, want)
        assert have["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-5), (kind, have)
        assert have["losses"][1] != have["losses"][0]  # the first step moved the model
        if kind != "tokens":  # transformers' Trainer logs none of them
            _same_token_metrics(have, want)
    assert "num_tokens" not in got["tokens"]["token_metrics"][0]
    assert set(quickstart["events"]) == set(EVENTS), quickstart
    assert quickstart["events"]["on_step_end"] == 4
    assert quickstart["model"].startswith("PeftModel")  # trainer.model after train()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_folder)
    adapted = PeftModel.from_pretrained(base, quickstart["saved"])
    assert (Path(quickstart["saved"]) / "tokenizer_config.json").exists()  # as TRL's folder
    assert any("lora_A" in name for name, _ in adapted.named_parameters())


def test_an_unsupported_field_stops_with_one_line(model_folder, tmp_path, capsys) -> None:
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    config = SFTConfig(output_dir=str(tmp_path / "out"), neftune_noise_alpha=5.0, bf16=False)
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(
            model=str(model_folder), args=config, train_dataset=Dataset.from_list([{"text": "a"}])
        )
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("datacentric SFTTrainer: ")
    assert "neftune_noise_alpha=5.0" in lines[0]


def test_the_package_imports_neither_trl_nor_transformers() -> None:
    code = (
        "import sys, datacentric.integrations.trl, datacentric.integrations.transformers; "
        "print(sorted(m for m in ('trl', 'transformers', 'peft') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_launch_is_told_to_transformers_without_an_accelerator(monkeypatch) -> None:
    import torch

    from datacentric.integrations.launcher import tell_transformers_the_launch

    found = {"device": None}
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: found["device"]
    )
    launched = {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert tell_transformers_the_launch(launched) and launched["ACCELERATE_USE_CPU"] == "true"
    for environ in (
        {"WORLD_SIZE": "2"},  # no launcher
        {"LOCAL_RANK": "0", "WORLD_SIZE": "1"},  # one process
        {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "ACCELERATE_USE_CPU": "false"},  # the user's
    ):
        before = dict(environ)
        assert not tell_transformers_the_launch(environ) and environ == before
    found["device"] = torch.device("cuda", 0)  # accelerate finds the launch itself
    environ = {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    assert not tell_transformers_the_launch(environ) and "ACCELERATE_USE_CPU" not in environ
