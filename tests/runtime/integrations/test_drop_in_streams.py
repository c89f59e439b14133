"""A stream (``datasets.IterableDataset``, no length) given as the training set: the
drop-in ``Trainer`` trains the rows transformers' own reads of it (its first
``max_steps`` x the global batch rows), or stops in one line where transformers raises
(no ``max_steps``). One process, a tiny Qwen2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]


def _stream():
    """8 rows of one text, then 400 of others: transformers' 2 steps of 4 read the
    first 8 only."""
    from datasets import IterableDataset

    def rows():
        for i in range(408):
            ids = [5, 6, 7, 8, 9, 10] if i < 8 else [(3 * i + k) % 40 + 3 for k in range(6)]
            yield {"input_ids": ids, "labels": ids}

    return IterableDataset.from_generator(rows)


def _run(trainer_class, folder: Path, out: Path, **fields):
    """The losses and grad norms logged and the trained weights."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        TrainingArguments,
        default_data_collator,
    )

    args = TrainingArguments(
        **{
            "output_dir": str(out),
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "report_to": "none",
            "use_cpu": True,
            **fields,
        }
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=default_data_collator,
        train_dataset=_stream(),
        processing_class=AutoTokenizer.from_pretrained(folder),
    )
    trainer.train()
    logged = [(r["loss"], r["grad_norm"]) for r in trainer.state.log_history if "loss" in r]
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return logged, weights


def test_a_stream_trains_the_rows_transformers_reads_of_it(tmp_path, monkeypatch, capsys) -> None:
    import torch
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    want, want_weights = _run(Reference, folder, tmp_path / "ref", max_steps=2)
    have, weights = _run(Trainer, folder, tmp_path / "ours", max_steps=2)
    assert len(have) == len(want) == 2
    for (loss, norm), (want_loss, want_norm) in zip(have, want):
        assert loss == pytest.approx(want_loss, rel=1e-5)
        assert norm == pytest.approx(want_norm, rel=1e-5)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=1e-5, msg=name)
    # no max_steps: transformers raises (a stream has no length); the drop-in stops
    with pytest.raises(SystemExit) as stopped:
        _run(Trainer, folder, tmp_path / "epochs", num_train_epochs=1)
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("datacentric Trainer: train_dataset is an IterableDataset")
    assert "set max_steps" in line
