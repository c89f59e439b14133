"""The drop-in ``Trainer`` against transformers' own, one honoured field at a time: the
same script, only the trainer class changed, compared step by step (the logged loss,
learning rate, grad_norm, epoch and step), in train()'s metrics (train_loss, epoch) and
in the trained weights.

A tiny Qwen2, CPU, a few steps. The drop-in's data order is its own (docs/integrations.md),
so a case either trains the whole set in each step (4 distinct rows: the math of the
optimizer, schedule, clipping and accumulation), or trains identical rows (any order is
the same: the step count, partial batches and the epoch counting).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]

#: the rows each step's batch is made of, and the fields of the case
DISTINCT, SAME, VARIED = "distinct", "same", "varied"
WHOLE = dict(per_device_train_batch_size=4, max_steps=4, warmup_steps=1)
CASES = {
    # the learning-rate schedules, with lr_scheduler_kwargs where they take some
    "linear": (DISTINCT, dict(lr_scheduler_type="linear")),
    "cosine": (DISTINCT, dict(lr_scheduler_type="cosine")),
    "cosine_with_restarts": (
        DISTINCT,
        dict(lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2}),
    ),
    "polynomial": (
        DISTINCT,
        dict(lr_scheduler_type="polynomial", lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-5}),
    ),
    "constant": (DISTINCT, dict(lr_scheduler_type="constant", warmup_steps=0)),
    "constant_with_warmup": (DISTINCT, dict(lr_scheduler_type="constant_with_warmup")),
    "inverse_sqrt": (
        DISTINCT,
        dict(lr_scheduler_type="inverse_sqrt", lr_scheduler_kwargs={"timescale": 2}),
    ),
    "warmup_share": (DISTINCT, dict(warmup_steps=0.5, max_steps=5)),
    # AdamW and clipping
    "weight_decay": (DISTINCT, dict(weight_decay=0.3, learning_rate=1e-2)),
    "adam": (DISTINCT, dict(adam_beta1=0.5, adam_beta2=0.9, adam_epsilon=1e-3)),
    "optim_fused": (DISTINCT, dict(optim="adamw_torch_fused")),
    "max_grad_norm": (DISTINCT, dict(max_grad_norm=0.5)),
    "max_grad_norm_0": (DISTINCT, dict(max_grad_norm=0.0)),
    "max_grad_norm_negative": (DISTINCT, dict(max_grad_norm=-1.0)),  # no clipping
    # accumulation over rows of other lengths: the mean over every loss token of the step
    "accumulation": (VARIED, dict(per_device_train_batch_size=1, gradient_accumulation_steps=4)),
    # what is logged
    "logging_steps": (DISTINCT, dict(logging_steps=2, max_steps=5)),
    "logging_share": (DISTINCT, dict(logging_steps=0.3, max_steps=7)),
    "logging_first_step": (DISTINCT, dict(logging_steps=3, logging_first_step=True, max_steps=5)),
    "eval_and_save_shares": (
        DISTINCT,
        dict(eval_strategy="steps", eval_steps=0.5, save_steps=0.25, max_steps=4),
    ),
    # the steps and epochs of batches smaller than the set
    "partial_batch": (SAME, dict(per_device_train_batch_size=2, num_train_epochs=2)),
    # 4 micro-batches an epoch accumulated by 3: a step of 3, then of 1
    "partial_accumulation": (
        SAME,
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_train_epochs=3),
    ),
    "max_steps_past_an_epoch": (
        SAME,
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, max_steps=5),
    ),
    "epochs_share": (
        SAME,
        dict(per_device_train_batch_size=2, num_train_epochs=1.5, lr_scheduler_type="cosine"),
    ),
    "logging_epoch": (
        SAME,
        dict(per_device_train_batch_size=2, num_train_epochs=2, logging_strategy="epoch"),
    ),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _rows(kind: str) -> list[dict[str, list[int]]]:
    """4 distinct rows of 6 tokens, 7 identical ones, or 4 of 3 to 9 tokens."""
    if kind == SAME:
        return [{"input_ids": [k % 40 + 3 for k in range(6)]}] * 7
    width = (lambda i: 3 + 2 * i) if kind == VARIED else (lambda i: 6)
    return [{"input_ids": [(3 * i + k) % 40 + 3 for k in range(width(i))]} for i in range(4)]


def _run(trainer_class, folder: Path, out: Path, kind: str, fields: dict):
    """The case's script: the log history, train()'s metrics, the trained weights and the
    steps of the checkpoints saved."""
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        TrainingArguments,
        default_data_collator,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = _rows(kind)
    if kind == VARIED:  # padded to the longest, no loss on the padding
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    else:
        rows, collator = [{**r, "labels": r["input_ids"]} for r in rows], default_data_collator
    base = {} if kind == SAME else WHOLE
    args = TrainingArguments(
        **{
            "output_dir": str(out),
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "report_to": "none",
            "use_cpu": True,
            **base,
            **fields,
        }
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=collator,
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:2]),
        processing_class=tokenizer,
    )
    metrics = trainer.train().metrics
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    return trainer.state.log_history, metrics, weights, saved


def _steps(history: list[dict]) -> list[dict]:
    keys = ("step", "epoch", "loss", "learning_rate", "grad_norm")
    return [{k: r.get(k) for k in keys} for r in history if "loss" in r]


@pytest.mark.parametrize("case", CASES)
def test_each_field_trains_as_transformers(folder, tmp_path, case) -> None:
    import torch
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    kind, fields = CASES[case]
    want, want_metrics, want_weights, want_saved = _run(
        Reference, folder, tmp_path / "ref", kind, fields
    )
    have, metrics, weights, saved = _run(Trainer, folder, tmp_path / "ours", kind, fields)
    assert saved == want_saved
    evals = [(r["step"], r["eval_loss"]) for r in have if "eval_loss" in r]
    want_evals = [(r["step"], r["eval_loss"]) for r in want if "eval_loss" in r]
    assert [s for s, _ in evals] == [s for s, _ in want_evals]
    assert [x for _, x in evals] == pytest.approx([x for _, x in want_evals], rel=1e-4)
    want, have = _steps(want), _steps(have)
    assert [r["step"] for r in have] == [r["step"] for r in want]
    assert len(want) >= 2
    for mine, theirs in zip(have, want):
        at = f"step {theirs['step']}"
        assert mine["epoch"] == pytest.approx(theirs["epoch"], rel=1e-9), at
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4), at
        assert mine["learning_rate"] == pytest.approx(theirs["learning_rate"], rel=1e-6), at
        assert (mine["grad_norm"] is None) == (theirs["grad_norm"] is None), at
        if theirs["grad_norm"] is not None:
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4), at
    assert metrics["epoch"] == pytest.approx(want_metrics["epoch"], rel=1e-9)
    assert metrics["train_loss"] == pytest.approx(want_metrics["train_loss"], rel=1e-4)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=1e-5, msg=name)


def test_drop_last_with_accumulation_that_drops_other_samples_is_refused(
    folder, tmp_path, capsys
) -> None:
    """transformers leaves out the last partial micro-batch (of 7 rows in micro-batches of
    2 accumulated by 2: 6 rows in 2 steps an epoch); the runtime leaves out the last
    partial global batch (4 rows in 1 step): refused in one line, not trained otherwise."""
    fields = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        dataloader_drop_last=True,
    )
    from datacentric.integrations.transformers import Trainer

    with pytest.raises(SystemExit) as stopped:
        _run(Trainer, folder, tmp_path / "ours", SAME, fields)
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after the script's loading
    assert line.startswith("datacentric Trainer: dataloader_drop_last=True with ")
    assert "transformers trains 6 of the 7 samples an epoch" in line
