"""A callback's ``TrainerControl`` steers the drop-in's run, and ``train(resume_from_checkpoint=
True)`` continues it: one process, a tiny Qwen2, 4 text samples, 2 per step, 2 epochs;
``should_epoch_stop`` ends an epoch where TRL's ends it (3 epochs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]


def test_should_save_and_should_training_stop_then_resume(tmp_path, monkeypatch, capsys) -> None:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")

    class Steer(TrainerCallback):
        def __init__(self):
            self.saves, self.evaluations = [], 0

        def on_step_end(self, args, state, control, **kw):
            control.should_save = state.global_step == 1
            control.should_training_stop = state.global_step == 2

        def on_save(self, args, state, control, **kw):
            self.saves.append(state.global_step)

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            self.evaluations += 1

    texts = [{"text": "hello world " * (1 + i)} for i in range(4)]
    out = tmp_path / "run"
    config = SFTConfig(
        output_dir=str(out),
        per_device_train_batch_size=2,
        num_train_epochs=2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        report_to="none",
        bf16=False,
    )
    steer = Steer()
    trainer = SFTTrainer(
        model=str(folder),
        args=config,
        train_dataset=Dataset.from_list(texts),
        eval_dataset=Dataset.from_list(texts[:2]),
        callbacks=[steer],
    )
    trainer.train()
    assert trainer.state.global_step == 2  # stopped, though 4 steps were planned
    # as transformers: on_save where a callback asked (the runtime's final checkpoint of
    # step 2 is written too, and linked, without an on_save)
    assert steer.saves == [1] and steer.evaluations == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-2")
    with pytest.raises(SystemExit):  # an earlier run is never deleted: refused in one line
        SFTTrainer(
            model=str(folder),
            args=config,
            train_dataset=Dataset.from_list(texts),
            eval_dataset=Dataset.from_list(texts[:2]),
        ).train()
    assert "holds an earlier run" in capsys.readouterr().err
    again = SFTTrainer(
        model=str(folder),
        args=config,
        train_dataset=Dataset.from_list(texts),
        eval_dataset=Dataset.from_list(texts[:2]),
    )
    again.train(resume_from_checkpoint=get_last_checkpoint(str(out)))
    with pytest.raises(SystemExit):  # a resume once the run is built is refused, not ignored
        again.train(resume_from_checkpoint=True)
    assert again.state.global_step == 4
    # as transformers: the checkpoint's log history restored, the tokens counted on
    logged = [r for r in again.state.log_history if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    tokens = [r["num_tokens"] for r in logged]
    assert tokens == sorted(set(tokens)) and again.state.num_input_tokens_seen == tokens[-1]


def _epoch_stop_run(trainer_class, folder: Path, out: Path) -> tuple[list, list, int]:
    """A callback sets ``should_epoch_stop`` at step 3 (epoch 2's first of 2): the events
    ``(name, global_step, epoch)``, the logged ``(step, learning_rate)`` and the last step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig

    class CutEpoch(TrainerCallback):
        def __init__(self):
            self.events = []

        def _seen(self, name, state):
            self.events.append((name, state.global_step, round(state.epoch, 6)))

        def on_epoch_begin(self, args, state, control, **kw):
            self._seen("on_epoch_begin", state)

        def on_epoch_end(self, args, state, control, **kw):
            self._seen("on_epoch_end", state)

        def on_step_end(self, args, state, control, **kw):
            self._seen("on_step_end", state)
            control.should_epoch_stop = state.global_step == 3

    cut = CutEpoch()
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=SFTConfig(
            output_dir=str(out),
            per_device_train_batch_size=2,
            num_train_epochs=3,
            learning_rate=1e-3,
            lr_scheduler_type="linear",
            logging_steps=1,
            report_to="none",
            bf16=False,
        ),
        train_dataset=Dataset.from_list([{"text": "hello world " * (1 + i)} for i in range(4)]),
        processing_class=AutoTokenizer.from_pretrained(folder),
        callbacks=[cut],
    )
    trainer.train()
    history = trainer.state.log_history
    rates = [(r["step"], pytest.approx(r["learning_rate"])) for r in history if "loss" in r]
    return cut.events, rates, trainer.state.global_step


def test_should_epoch_stop_skips_the_rest_of_the_epoch_as_trl(tmp_path, monkeypatch) -> None:
    from trl import SFTTrainer as TRLTrainer

    from datacentric.integrations.trl import SFTTrainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    want = _epoch_stop_run(TRLTrainer, folder, tmp_path / "trl")
    have = _epoch_stop_run(SFTTrainer, folder, tmp_path / "ours")
    assert want[2] == 5  # 6 planned, epoch 2's second step skipped
    assert ("on_epoch_end", 3, 1.5) in want[0]
    assert have == want


def test_an_argument_train_does_not_take_stops_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    """transformers' ``train()`` raises on a keyword it does not take (``model_path``,
    transformers 4's name of ``resume_from_checkpoint``); the drop-in's stops naming it
    instead of training as if it were not given."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainingArguments

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=1, report_to="none", use_cpu=True
    )
    trainer = Trainer(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        train_dataset=Dataset.from_list([{"input_ids": [5, 6, 7, 8]}] * 2),
    )
    for keywords, named in (
        ({"model_path": str(tmp_path / "elsewhere")}, "train(model_path=...): not an argument"),
        ({"trial": {"learning_rate": 1e-3}}, "train(trial=...): not supported"),
    ):
        with pytest.raises(SystemExit) as stopped:
            trainer.train(**keywords)
        assert stopped.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"datacentric Trainer: {named}"), line
    assert not (tmp_path / "out" / "run" / "checkpoints").exists()
