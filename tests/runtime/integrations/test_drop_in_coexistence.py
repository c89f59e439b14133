"""The drop-in ``Trainer`` beside transformers' own in one script, in every order of
building and training: each ``TrainingArguments`` clears accelerate's shared state when it
sets up its device, and transformers' ``Trainer`` builds it again; a drop-in built between
a transformers ``Trainer`` and its ``train()`` must leave it set up as well. One process, a
tiny Qwen2, 2 steps each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]
WORDS = "hello world how are you the user asks hello world how are you"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _built(trainer_class, folder: Path, out: Path):
    """``trainer_class`` on blocks of 4 tokens, with its own ``TrainingArguments``."""
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        TrainingArguments,
        default_data_collator,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(WORDS)["input_ids"]
    rows = [{"input_ids": ids[i : i + 4], "labels": ids[i : i + 4]} for i in range(0, 12, 4)]
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=len(rows),
        logging_steps=1,
        report_to="none",
        use_cpu=True,
    )
    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )


# (who is built or trained, in order): "+X" builds X, "X" trains it
ORDERS = {
    "transformers built, drop-in built, both train": ["+hf", "+ours", "hf", "ours"],
    "drop-in built, transformers built, both train": ["+ours", "+hf", "ours", "hf"],
    "transformers trains, then the drop-in": ["+hf", "hf", "+ours", "ours"],
    "drop-in trains, then transformers": ["+ours", "ours", "+hf", "hf"],
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_both_trainers_train_in_one_script(folder, order, tmp_path, monkeypatch) -> None:
    import torch.distributed as dist
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer as DropIn

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    classes = {"hf": Reference, "ours": DropIn}
    trainers, losses = {}, {}
    for step in ORDERS[order]:
        if step.startswith("+"):
            trainers[step[1:]] = _built(classes[step[1:]], folder, tmp_path / step[1:])
        else:
            losses[step] = trainers[step].train().training_loss
    assert not dist.is_initialized()  # one process: no process group was started
    # the same model, data and steps: both train and their losses agree
    assert losses["ours"] == pytest.approx(losses["hf"], rel=1e-3)
    assert [r["step"] for r in trainers["ours"].state.log_history if "loss" in r] == [1, 2]
