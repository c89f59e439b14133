"""``compute_metrics`` and ``preprocess_logits_for_metrics`` as transformers'
``run_clm.py --do_eval`` passes them (argmax of the logits; the accuracy of
``preds[:, :-1]`` against ``labels[:, 1:]`` where the label is not -100), then
``trainer.evaluate()`` after ``train()``: the drop-in's metrics against transformers'
``Trainer.evaluate()`` on the same trained weights, eval set and collator (the drop-in
``SFTTrainer`` against TRL's likewise). One process, a tiny Qwen2 and its tokenizer built
here, texts grouped into blocks as run_clm groups them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

BLOCK = 8


def _accuracy(eval_preds) -> dict[str, float]:
    """run_clm's metric: the share of shifted targets the argmax predicts."""
    import numpy as np

    preds, labels = eval_preds
    preds, labels = preds[:, :-1].reshape(-1), labels[:, 1:].reshape(-1)
    kept = labels != -100
    return {"accuracy": float(np.mean(preds[kept] == labels[kept]))}


def _argmax(logits, labels):
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def _blocks(tokenizer, texts: list[str]):
    """run_clm's ``group_texts``: the texts' ids concatenated and cut into blocks,
    ``labels`` a copy of ``input_ids``."""
    from datasets import Dataset

    ids = [t for text in texts for t in tokenizer(text)["input_ids"]]
    count = len(ids) // BLOCK
    rows = [ids[i * BLOCK : (i + 1) * BLOCK] for i in range(count)]
    return Dataset.from_list([{"input_ids": r, "labels": list(r)} for r in rows])


def _args(out: Path, config: type | None = None, **extra):
    from transformers import TrainingArguments

    return (config or TrainingArguments)(
        output_dir=str(out),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=2,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        bf16=False,
        use_cpu=True,
        **extra,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The model folder, its tokenizer, and run_clm's train and eval blocks."""
    from chat_data import WORDS, save_tiny_qwen2
    from transformers import AutoTokenizer

    folder = save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    words = WORDS.split()
    texts = [" ".join(words[i % 5 :] + words[: i % 5]) for i in range(6)]
    return folder, tokenizer, _blocks(tokenizer, texts[:4]), _blocks(tokenizer, texts[4:])


def _trainers(library: str) -> tuple[type, type, type | None, dict]:
    """The drop-in, the reference it stands for, its arguments class (None:
    TrainingArguments) and run_clm's collator (TRL's SFTTrainer: its own)."""
    if library == "transformers":
        from transformers import Trainer as Reference
        from transformers import default_data_collator

        from datacentric.integrations.transformers import Trainer

        return Trainer, Reference, None, {"data_collator": default_data_collator}
    pytest.importorskip("trl")
    from trl import SFTConfig
    from trl import SFTTrainer as Reference

    from datacentric.integrations.trl import SFTTrainer

    return SFTTrainer, Reference, SFTConfig, {}


@pytest.mark.parametrize("library", ["transformers", "trl"])
def test_compute_metrics_after_train_as_transformers_evaluate(
    data, library, tmp_path, monkeypatch
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder, tokenizer, train, held = data
    assert len(held) == 3  # an odd count: batches of 2 against records one at a time
    Trainer, Reference, config, collator = _trainers(library)
    given = {
        **collator,
        "eval_dataset": held,
        "processing_class": tokenizer,
        "compute_metrics": _accuracy,
        "preprocess_logits_for_metrics": _argmax,
    }
    model = AutoModelForCausalLM.from_pretrained(folder)
    trainer = Trainer(
        model=model, args=_args(tmp_path / "ours", config), train_dataset=train, **given
    )
    trainer.train()
    ours = trainer.evaluate()
    reference = Reference(
        model=trainer.model, args=_args(tmp_path / "ref", config), train_dataset=train, **given
    )
    want = reference.evaluate()
    assert 0.0 < want["eval_accuracy"] < 1.0
    assert ours["eval_accuracy"] == want["eval_accuracy"]
    assert ours["eval_loss"] == pytest.approx(want["eval_loss"], abs=1e-5)
    assert trainer.state.log_history[-1]["eval_accuracy"] == want["eval_accuracy"]
    # predict() gives the argmax and the metric too, as transformers' predict()
    predicted = trainer.predict(held)
    assert predicted.predictions.shape == (len(held), BLOCK)
    assert predicted.metrics["test_accuracy"] == want["eval_accuracy"]
    # prediction_loss_only: transformers calls no compute_metrics
    trainer.args.prediction_loss_only = True
    assert "eval_accuracy" not in trainer.evaluate()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"eval_strategy": "steps", "eval_steps": 1}, "compute_metrics with eval_strategy='steps'"),
        ({"eval_on_start": True}, "compute_metrics with eval_on_start=True"),
        ({"batch_eval_metrics": True}, "batch_eval_metrics=True (compute_metrics is called once"),
    ],
)
def test_compute_metrics_during_training_is_refused_in_one_line(
    data, tmp_path, extra, named, capsys
) -> None:
    from datacentric.integrations.transformers import Trainer

    folder, tokenizer, train, held = data
    with pytest.raises(SystemExit) as stopped:
        Trainer(
            model=str(folder),
            args=_args(tmp_path, **extra),
            train_dataset=train,
            eval_dataset=held,
            processing_class=tokenizer,
            compute_metrics=_accuracy,
        )
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("datacentric Trainer: ")
    assert named in lines[0]
