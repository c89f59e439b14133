"""``metric_for_best_model``, ``load_best_model_at_end`` and ``EarlyStoppingCallback`` in
the drop-in ``SFTTrainer``, against TRL's own in the same process (and the drop-in
``Trainer`` against transformers' on run_clm's blocks): a tiny Qwen2, the training set as
one batch per step (the data order cannot matter), held-out texts evaluated and saved at
every step; at a learning rate of 5e-2 the eval loss is lowest at step 4 and rises after
it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]
WORDS = "hello world how are you the user asks".split()
TEXTS = [{"text": " ".join(WORDS[i : i + 3 + i])} for i in range(4)]
HELD = [{"text": "asks the user how you are world hello"}, {"text": "you are the world"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _config(out: Path, **extra):
    from trl import SFTConfig

    given = {
        "per_device_train_batch_size": 4,
        "max_steps": 6,
        "learning_rate": 5e-2,
        "eval_strategy": "steps",
        "eval_steps": 1,
        "save_steps": 1,
        "logging_steps": 1,
        "report_to": "none",
        "bf16": False,
        **extra,
    }
    return SFTConfig(output_dir=str(out), **given)


def _trainer(trainer_class, folder: Path, config, callbacks=()):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=config,
        train_dataset=Dataset.from_list(TEXTS),
        eval_dataset=Dataset.from_list(HELD),
        processing_class=AutoTokenizer.from_pretrained(folder),
        callbacks=list(callbacks),
    )


def _eval_losses(trainer) -> list[tuple[int, float]]:
    return [(r["step"], r["eval_loss"]) for r in trainer.state.log_history if "eval_loss" in r]


def _same_best(have, want) -> None:
    """The best metric, its step and its checkpoint's step equal the reference's."""
    assert have.state.best_metric == pytest.approx(want.state.best_metric, rel=1e-5)
    assert have.state.best_global_step == want.state.best_global_step
    assert (
        Path(have.state.best_model_checkpoint).name == Path(want.state.best_model_checkpoint).name
    )
    assert have.state.best_model_checkpoint == str(Path(have.args.output_dir) / "checkpoint-4")


def _weights(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _close(a: dict, b: dict) -> bool:
    """Equal up to float noise (1e-3: an Adam step at 5e-2 moves the weights ~5e-2; TRL's
    and the runtime's reductions differ in the last bits, which 2 steps more amplify)."""
    import torch

    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-3) for k in a)


def _blocks_trainer(trainer_class, folder: Path, out: Path):
    """transformers' ``Trainer`` (or the drop-in) on run_clm's blocks of 8 tokens: 4
    rotations of the words (7 blocks) trained as one batch per step, the words reversed
    (3 blocks) held out."""
    from chat_data import WORDS as CHAT_WORDS
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        TrainingArguments,
        default_data_collator,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)

    def blocks(texts: list[str]):
        ids = [t for text in texts for t in tokenizer(text)["input_ids"]]
        rows = [ids[i * 8 : (i + 1) * 8] for i in range(len(ids) // 8)]
        return Dataset.from_list([{"input_ids": r, "labels": list(r)} for r in rows])

    words = CHAT_WORDS.split()
    train = blocks([" ".join(words[i:] + words[:i]) for i in range(4)])
    config = _config(out).to_dict()
    given = {k: config[k] for k in ("max_steps", "learning_rate", "eval_steps", "save_steps")}
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=len(train),
        eval_strategy="steps",
        load_best_model_at_end=True,
        report_to="none",
        use_cpu=True,
        **given,
    )
    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        train_dataset=train,
        eval_dataset=blocks([" ".join(reversed(words))] * 2),
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )


@pytest.mark.parametrize("library", ["trl", "transformers"])
def test_load_best_model_at_end_as_transformers(folder, library, tmp_path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    if library == "trl":
        from trl import SFTTrainer as Reference

        from datacentric.integrations.trl import SFTTrainer as DropIn

        def built(trainer_class, out: Path):
            return _trainer(trainer_class, folder, _config(out, load_best_model_at_end=True))
    else:
        from transformers import Trainer as Reference

        from datacentric.integrations.transformers import Trainer as DropIn

        def built(trainer_class, out: Path):
            return _blocks_trainer(trainer_class, folder, out)

    want = built(Reference, tmp_path / "ref")
    want.train()
    have = built(DropIn, tmp_path / "ours")
    given = have.model
    have.train()
    losses = _eval_losses(have)
    for (s, a), (t, b) in zip(losses, _eval_losses(want), strict=True):
        assert s == t and a == pytest.approx(b, rel=1e-4)
    # the eval loss is lowest at step 4 and rises after it: the best is not the last
    assert min(losses, key=lambda r: r[1])[0] == 4 and losses[-1][1] > losses[3][1]
    _same_best(have, want)
    best = _weights(AutoModelForCausalLM.from_pretrained(tmp_path / "ref" / "checkpoint-4"))
    last = _weights(AutoModelForCausalLM.from_pretrained(tmp_path / "ref" / "checkpoint-6"))
    loaded = _weights(have.model)
    assert _close(loaded, best) and not _close(loaded, last)
    assert _close(loaded, _weights(want.model))
    have.save_model(str(tmp_path / "saved"))  # writes the best, as transformers
    assert _close(_weights(AutoModelForCausalLM.from_pretrained(tmp_path / "saved")), best)
    # as transformers: trainer.model is the object given, on args.device, and evaluate()
    # evaluates it (the best); it holds the run's own tensors (one copy of the model)
    assert have.evaluate()["eval_loss"] == pytest.approx(want.evaluate()["eval_loss"], rel=1e-4)
    run = dict(have._trainer.dc.module.hf.named_parameters())
    assert have.model is given
    for name, param in have.model.named_parameters():
        assert param.device == have.args.device and param.data_ptr() == run[name].data_ptr()


def test_early_stopping_as_transformers(folder, tmp_path, monkeypatch) -> None:
    from transformers import EarlyStoppingCallback
    from trl import SFTTrainer as Reference

    from datacentric.integrations.trl import SFTTrainer

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    config = {"load_best_model_at_end": True, "max_steps": 8}
    want = _trainer(
        Reference, folder, _config(tmp_path / "ref", **config), [EarlyStoppingCallback(1)]
    )
    want.train()
    have = _trainer(
        SFTTrainer, folder, _config(tmp_path / "ours", **config), [EarlyStoppingCallback(1)]
    )
    have.train()
    # one evaluation without a better loss (step 5) stops the run there
    assert have.state.global_step == want.state.global_step == 5
    _same_best(have, want)


def test_resume_keeps_the_best_so_far(folder, tmp_path, monkeypatch) -> None:
    from transformers import TrainerCallback

    from datacentric.integrations.trl import SFTTrainer

    class StopAtFive(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            control.should_training_stop = state.global_step == 5

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "ours"
    first = _trainer(SFTTrainer, folder, _config(out, metric_for_best_model="loss"), [StopAtFive()])
    first.train()
    assert first.state.global_step == 5 and first.state.best_global_step == 4
    again = _trainer(SFTTrainer, folder, _config(out, metric_for_best_model="loss"))
    again.train(resume_from_checkpoint=str(out / "checkpoint-5"))
    assert again.state.global_step == 6  # step 6's loss is above step 4's: still the best
    assert again.state.best_global_step == 4
    assert again.state.best_metric == first.state.best_metric
    assert again.state.best_model_checkpoint == str(out / "checkpoint-4")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"metric_for_best_model": "accuracy"}, "metric_for_best_model='accuracy'"),
        ({"load_best_model_at_end": True, "save_total_limit": 2}, "save_total_limit=2"),
        ({"load_best_model_at_end": True, "save_steps": 3, "eval_steps": 2}, "save_steps=3"),
    ],
)
def test_best_model_arguments_are_refused_in_one_line(
    folder, tmp_path, capsys, given, named
) -> None:
    from datacentric.integrations.trl import SFTTrainer

    config = _config(tmp_path / "ours", **{k: v for k, v in given.items() if "steps" not in k})
    for name, value in given.items():  # set after the checks of TrainingArguments
        setattr(config, name, value)
    with pytest.raises(SystemExit) as stopped:
        _trainer(SFTTrainer, folder, config)
    assert stopped.value.code == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "datacentric" in line]
    assert len(said) == 1 and said[0].startswith("datacentric SFTTrainer: ") and named in said[0]


def test_a_missing_metric_at_an_asked_evaluation_stops_in_one_line(
    folder, tmp_path, monkeypatch, capsys
) -> None:
    from transformers import TrainerCallback

    from datacentric.integrations.trl import SFTTrainer

    class EvaluateAtStepOne(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            control.should_evaluate = state.global_step == 1

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    config = _config(tmp_path / "ours", eval_strategy="no", metric_for_best_model="accuracy")
    trainer = _trainer(SFTTrainer, folder, config, [EvaluateAtStepOne()])
    with pytest.raises(SystemExit) as stopped:  # transformers raises a KeyError here
        trainer.train()
    assert stopped.value.code == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "datacentric" in line]
    assert said[-1].startswith("datacentric SFTTrainer: train(): metric_for_best_model=")
