"""TRL's ``DataCollatorForLanguageModeling`` given to the drop-ins: in transformers'
``Trainer`` it keeps every token and the labels as given (transformers' collator of the
same name masks the pad token instead), and ``SFTTrainer`` takes it as TRL's default.
One process, a tiny Qwen2, 4 rows trained as one batch per step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]


def _losses(trainer_class, folder: Path, out: Path) -> list[float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pad = tokenizer.pad_token_id
    # a pad token inside a row has a label under TRL's collator
    rows = [{"input_ids": [(3 * i + k) % 40 + 3 for k in range(6)] + [pad, 5]} for i in range(4)]
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=pad),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


def test_trl_s_collator_keeps_the_labels_as_trl(tmp_path, monkeypatch) -> None:
    from datasets import Dataset
    from transformers import Trainer as Reference
    from trl import SFTConfig
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from datacentric.integrations.transformers import Trainer
    from datacentric.integrations.trl import SFTTrainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    want = _losses(Reference, folder, tmp_path / "ref")
    assert _losses(Trainer, folder, tmp_path / "ours") == pytest.approx(want, rel=1e-5)
    # SFTTrainer given TRL's own collator (its default) runs as without it
    config = SFTConfig(output_dir=str(tmp_path / "sft"), bf16=False, report_to="none")
    texts = Dataset.from_list([{"text": "hello world"}])
    SFTTrainer(
        model=str(folder),
        args=config,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True),
        train_dataset=texts,
    )


@pytest.mark.parametrize("way", ["padded_rows", "seq2seq_label_pad"])
def test_a_loss_on_padding_is_refused_in_one_line(tmp_path, monkeypatch, capsys, way) -> None:
    """transformers' ``Trainer`` trains the labels a row puts on its padding (rows padded
    to ``max_length`` with ``labels`` copied from ``input_ids``, or
    ``DataCollatorForSeq2Seq(label_pad_token_id=...)`` padding each batch with a token
    that has a loss); the runtime packs without padding, so it could not train them:
    refused in one line, never trained without them."""
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        TrainingArguments,
        default_data_collator,
    )

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pad = tokenizer.pad_token_id
    rows = []
    for i in range(4):
        ids = [(3 * i + k) % 40 + 3 for k in range(3 + i)]
        if way == "padded_rows":  # padding="max_length", then labels = input_ids
            mask = [1] * len(ids) + [0] * (6 - len(ids))
            ids = ids + [pad] * (6 - len(ids))
            rows.append({"input_ids": ids, "attention_mask": mask, "labels": list(ids)})
        else:
            rows.append({"input_ids": ids, "labels": list(ids)})
    collator = (
        default_data_collator
        if way == "padded_rows"
        else DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=pad)
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
    )
    with pytest.raises(SystemExit) as stopped:
        trainer = Trainer(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=args,
            data_collator=collator,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        trainer.train()
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    if way == "padded_rows":
        assert line.startswith("datacentric Trainer: train/eval record 0: its labels put a loss")
        assert f"position 3: attention_mask 0, label {pad}" in line
    else:
        assert line.startswith(
            f"datacentric Trainer: data_collator: DataCollatorForSeq2Seq(label_pad_token_id={pad})"
        )
    assert not (tmp_path / "out" / "run" / "checkpoints").exists()


def test_a_row_without_a_target_is_refused_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    """transformers' ``Trainer`` counts a row whose labels are all -100 as a row of its
    batches (8 rows, 2 of them so, in batches of 2: 4 steps an epoch and its learning-rate
    schedule); the runtime has no sample for it and trained 3 steps on another schedule:
    refused in one line naming the record."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainingArguments, default_data_collator

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    rows = []
    for i in range(8):
        ids = [(3 * i + k) % 40 + 3 for k in range(6)]
        rows.append({"input_ids": ids, "labels": [-100] * 6 if i in (1, 5) else ids})
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_train_epochs=1,
        report_to="none",
        use_cpu=True,
    )
    trainer = Trainer(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=default_data_collator,
        train_dataset=Dataset.from_list(rows),
    )
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("datacentric Trainer: train/eval record 1: no label to train on")
    assert not (tmp_path / "out" / "run" / "checkpoints").exists()


def test_the_causal_lm_collator_masks_its_own_tokenizer_s_pad_token(tmp_path, monkeypatch) -> None:
    """transformers' ``DataCollatorForLanguageModeling(tokenizer, mlm=False)`` puts no loss
    on *its* tokenizer's pad token (a script sets ``pad_token`` on the tokenizer it gives
    the collator, and no ``processing_class``): the drop-in masks the same token, not the
    model folder's pad token (2 steps of 4 rows holding it: the same losses)."""
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        TrainingArguments,
    )
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    rows = [{"input_ids": [(3 * i + k) % 6 + 3 for k in range(8)]} for i in range(4)]

    def losses(trainer_class, out: Path) -> list[float]:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(5)  # in every row
        args = TrainingArguments(
            output_dir=str(out),
            per_device_train_batch_size=4,
            max_steps=2,
            learning_rate=1e-3,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
        )
        trainer = trainer_class(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=args,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            train_dataset=Dataset.from_list(rows),
        )
        trainer.train()
        return [r["loss"] for r in trainer.state.log_history if "loss" in r]

    want = losses(Reference, tmp_path / "ref")
    assert losses(Trainer, tmp_path / "ours") == pytest.approx(want, rel=1e-5)
