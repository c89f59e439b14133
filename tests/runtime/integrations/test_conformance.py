"""Every field of the installed ``TrainingArguments`` and ``SFTConfig`` and every public
method of ``Trainer`` / ``SFTTrainer`` is classified in settings.trainer_fields (so a new
release cannot add an argument the drop-ins silently ignore), and a refused one set away
from its default stops the drop-in in one line naming it and why."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

pytest.importorskip("trl")

from datacentric.settings.trainer_fields import METHODS, REFUSED, fields  # noqa: E402


def unclassified(*classes: type) -> list[str]:
    """The init fields of the ``classes`` (dataclasses) that the table does not know."""
    known = fields()
    names = {f.name for c in classes for f in dataclasses.fields(c) if f.init}
    return sorted(n for n in names if not n.startswith("_") and n not in known)


def test_every_installed_field_and_method_is_classified() -> None:
    from transformers import Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    assert unclassified(TrainingArguments, SFTConfig) == []
    public = {n for c in (Trainer, SFTTrainer) for n in dir(c) if not n.startswith("_")}
    assert sorted(public - set(METHODS)) == []
    # nothing classified that the installed releases lack (a removed field is taken out)
    names = {f.name for c in (TrainingArguments, SFTConfig) for f in dataclasses.fields(c)}
    assert set(fields()) <= names


def test_a_planted_field_is_caught() -> None:
    from transformers import TrainingArguments

    @dataclasses.dataclass
    class Newer(TrainingArguments):
        new_knob: int = 0

    assert unclassified(Newer) == ["new_knob"]


def test_a_refused_field_and_method_stop_in_one_line(tmp_path, capsys) -> None:
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    assert fields()["label_smoothing_factor"].kind == REFUSED
    config = SFTConfig(output_dir=str(tmp_path), label_smoothing_factor=0.1, bf16=False)
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(model="unused", args=config, train_dataset=Dataset.from_list([{"text": "a"}]))
    assert stopped.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "label_smoothing_factor=0.1 (the loss is the model's own cross-entropy)" in line
    # transformers 4's default optimizer is the runtime's AdamW: taken; another is named
    texts = Dataset.from_list([{"text": "a"}])
    for optim in ("adamw_torch", "adamw_torch_fused"):
        config = SFTConfig(output_dir=str(tmp_path), optim=optim, bf16=False)
        SFTTrainer(model="unused", args=config, train_dataset=texts)
    # tf32 is set in torch's flags by the arguments themselves (True needs a GPU)
    config = SFTConfig(output_dir=str(tmp_path), tf32=False, bf16=False)
    SFTTrainer(model="unused", args=config, train_dataset=texts)
    config = SFTConfig(output_dir=str(tmp_path), optim="sgd", bf16=False)
    with pytest.raises(SystemExit):
        SFTTrainer(model="unused", args=config, train_dataset=texts)
    assert "optim='sgd' (the runtime builds AdamW" in capsys.readouterr().err
    # transformers then adds train_mem_* / eval_mem_* metrics, which the drop-ins do not
    config = SFTConfig(output_dir=str(tmp_path), skip_memory_metrics=False, bf16=False)
    with pytest.raises(SystemExit):
        SFTTrainer(model="unused", args=config, train_dataset=texts)
    assert "skip_memory_metrics=False (transformers' *_mem_* metrics" in capsys.readouterr().err
    trainer = SFTTrainer(
        model="unused",
        args=SFTConfig(output_dir=str(tmp_path), bf16=False),
        train_dataset=Dataset.from_list([{"text": "a"}]),
    )
    for call in (trainer.push_to_hub, trainer.hyperparameter_search):
        with pytest.raises(SystemExit):
            call()
        assert len(capsys.readouterr().err.strip().splitlines()) == 1

    class Custom(SFTTrainer):
        def compute_loss(self, *args, **kwargs):  # never called by the runtime
            return 0

    with pytest.raises(SystemExit):
        Custom(model="unused", args=config, train_dataset=Dataset.from_list([{"text": "a"}]))
    assert "Custom.compute_loss: overriding it has no effect" in capsys.readouterr().err


def test_fields_become_settings(tmp_path) -> None:
    from transformers import TrainingArguments

    from datacentric.integrations.arguments import (
        ArgumentsError,
        sinks,
        steps_per_epoch,
        training_settings,
    )
    from datacentric.settings.scheduling import SchedulingConfig

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        dataloader_drop_last=True,
        ddp_timeout=77,
        save_total_limit=2,
        use_cpu=True,
        report_to="none",
    )
    sections = training_settings(args, world=2, tokens=[7] * 25)
    assert sections["scheduling"] == {"global_batch_samples": 12, "drop_remainder": True}
    batch = SchedulingConfig(**sections["scheduling"])
    assert steps_per_epoch(args, [7] * 25, batch) == 2  # the partial third batch is left out
    assert sections["parallelism"] == {"collective_timeout_s": 77.0, "device": "cpu"}
    assert sections["checkpoint"]["keep_last"] == 2
    # under max_steps transformers reads no num_train_epochs (a share of one included)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, num_train_epochs=0.5)
    training = training_settings(args, world=1, tokens=[7] * 16)["training"]
    assert (training["iterations"], training["epochs"]) == (3, 2)  # 2 steps an epoch
    # no epoch and no max_steps: transformers returns untrained; refused, not one epoch
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=0)
    with pytest.raises(ArgumentsError, match="num_train_epochs=0 with no max_steps"):
        training_settings(args, world=1, tokens=[7] * 16)
    # report_to="all": the installed ones, as transformers (wandb is not a dependency)
    installed = {
        name: importlib.util.find_spec(name) is not None for name in ("tensorboard", "wandb")
    }
    assert sinks("all") == sinks(["all"]) == installed
    # transformers deletes no checkpoint at save_total_limit=0, as when it is unset
    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=0)
    assert training_settings(args, world=1, tokens=[7] * 16)["checkpoint"]["keep_last"] is None


def test_lr_schedules_equal_transformers(tmp_path) -> None:
    """Each schedule is transformers' own lambda (the run_clm-style test trains with
    cosine against transformers' Trainer); one that is not a per-step multiplier, or
    lacks its arguments, is refused by name."""
    import torch
    from transformers import TrainingArguments
    from transformers.optimization import get_scheduler

    from datacentric.integrations.arguments import SCHEDULES, ArgumentsError, lr_factor

    for name in SCHEDULES:
        kwargs = {"num_decay_steps": 3} if name == "warmup_stable_decay" else {}
        if "min_lr" in name:
            kwargs = {"min_lr_rate": 0.1}
        args = TrainingArguments(
            output_dir=str(tmp_path),
            lr_scheduler_type=name,
            lr_scheduler_kwargs=kwargs,
            warmup_steps=2,
            learning_rate=0.5,
        )
        ours = lr_factor(args, 10)
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        reference = get_scheduler(name, optimizer, 2, 10, scheduler_specific_kwargs=kwargs)
        rates = []
        for _ in range(10):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            reference.step()
        assert [0.5 * ours(n) for n in range(10)] == pytest.approx(rates, rel=1e-12), name
    for name, kwargs in (("reduce_lr_on_plateau", {}), ("warmup_stable_decay", {})):
        args = TrainingArguments(
            output_dir=str(tmp_path),
            lr_scheduler_type=name,
            lr_scheduler_kwargs=kwargs,
            eval_strategy="epoch",
        )
        with pytest.raises(ArgumentsError, match=f"lr_scheduler_type={name!r}"):
            lr_factor(args, 10)


def test_the_drop_in_crashes_of_a_script_end_in_one_line(tmp_path, capsys) -> None:
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    def trainer(out):
        config = SFTConfig(output_dir=str(out), bf16=False, report_to="none")
        texts = Dataset.from_list([{"text": "a"}])
        return SFTTrainer(model=str(tmp_path / "no-model"), args=config, train_dataset=texts)

    calls = {
        "resume_from_checkpoint='missing/path'": lambda t: t.train(
            resume_from_checkpoint="missing/path"
        ),
        "save_model(": lambda t: t.save_model(t.args.output_dir),
        "model=": lambda t: t.train(),  # no such model folder
        "save_state()": lambda t: t.save_state(),  # output_dir is a file
    }
    (tmp_path / "a-file").write_text("x")
    for named, call in calls.items():
        out = tmp_path / ("a-file" if named == "save_state()" else "out")
        with pytest.raises(SystemExit) as stopped:
            call(trainer(out))
        err = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(err) == 1, err
        assert err[0].startswith("datacentric SFTTrainer: ") and named in err[0], err


def test_a_wrong_constructor_argument_ends_in_one_line(capsys) -> None:
    from datasets import Dataset

    from datacentric.integrations.transformers import Trainer
    from datacentric.integrations.trl import SFTTrainer

    texts = Dataset.from_list([{"text": "a"}])
    for build in (
        lambda: SFTTrainer(model="m", args={"output_dir": "x"}, train_dataset=texts),
        lambda: Trainer(model="m", args="x", train_dataset=texts),
    ):
        with pytest.raises(SystemExit):
            build()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "args=" in err[0], err
    # TrainingArguments given to SFTTrainer become an SFTConfig, as TRL does
    from transformers import TrainingArguments
    from trl import SFTConfig

    given = TrainingArguments(output_dir="x", learning_rate=0.25, bf16=False)
    converted = SFTTrainer(model="m", args=given, train_dataset=texts).args
    assert isinstance(converted, SFTConfig) and converted.learning_rate == 0.25


def test_a_resume_with_no_checkpoint_of_its_own_stops_as_transformers(tmp_path, capsys) -> None:
    """transformers raises on ``resume_from_checkpoint=True`` with no checkpoint in
    ``output_dir``; the drop-in started a new run at step 1 without a word (and took
    transformers' own ``checkpoint-N`` folders there for nothing)."""
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    out = tmp_path / "out"
    texts = Dataset.from_list([{"text": "a"}])

    def stops(resume, named: str) -> None:
        config = SFTConfig(output_dir=str(out), bf16=False, report_to="none")
        trainer = SFTTrainer(model=str(tmp_path / "m"), args=config, train_dataset=texts)
        with pytest.raises(SystemExit) as stopped:
            trainer.train(resume_from_checkpoint=resume)
        err = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(err) == 1 and named in err[0], err

    stops(True, "resume_from_checkpoint=True: no checkpoint of a datacentric run")
    # a folder transformers' Trainer left: named, never resumed, written over or linked
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "trainer_state.json").write_text("{}")
    stops(True, "(checkpoint-3: not a drop-in run's)")
    stops(str(out / "checkpoint-3"), "a checkpoint of transformers' own Trainer")
    stops(None, "holds checkpoint-3, not a drop-in run's checkpoint")
    # a copy of a drop-in checkpoint (links followed) is not taken for transformers' own
    copied = tmp_path / "copied" / "checkpoint-5"
    copied.mkdir(parents=True)
    (copied / "manifest.json").write_text("{}")
    config = SFTConfig(output_dir=str(copied.parent), bf16=False, report_to="none")
    with pytest.raises(SystemExit):
        SFTTrainer(model=str(tmp_path / "m"), args=config, train_dataset=texts).train()
    assert "model=" in capsys.readouterr().err  # the missing model, not checkpoint-5
    # another output_dir's checkpoint: named, not refused for settings that only moved
    other = tmp_path / "other" / "run" / "checkpoints" / "step-00000002"
    other.mkdir(parents=True)
    stops(str(other), f"not a checkpoint of output_dir {out}")


def test_an_eval_strategy_with_no_eval_dataset_stops_as_transformers(capsys) -> None:
    """transformers raises on ``eval_strategy`` with no ``eval_dataset``; the drop-ins
    trained without one evaluation."""
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    config = SFTConfig(output_dir="x", eval_strategy="steps", eval_steps=1, bf16=False)
    with pytest.raises(SystemExit) as stopped:
        SFTTrainer(model="m", args=config, train_dataset=Dataset.from_list([{"text": "a"}]))
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1, err
    assert "eval_strategy='steps': no eval_dataset" in err[0], err


def test_trl_s_sft_script_arguments_are_taken(capsys) -> None:
    """TRL's own sft.py gives ``model_init_kwargs`` its defaults (revision, trust_remote_code,
    attn_implementation, dtype) and ``quantization_config=None``: they were refused (the
    keyword ended in an internal error); a quantization or a remote code is named."""
    from datasets import Dataset
    from trl import SFTConfig

    from datacentric.integrations.trl import SFTTrainer

    texts = Dataset.from_list([{"text": "a"}])
    init = dict(revision="main", trust_remote_code=False, attn_implementation="sdpa")
    config = SFTConfig(output_dir="x", model_init_kwargs={**init, "dtype": "float32"}, bf16=False)
    SFTTrainer(model="m", args=config, train_dataset=texts, quantization_config=None)
    remote = {"trust_remote_code": True}
    for given, named in (
        ({"quantization_config": object()}, "quantization_config: quantized (QLoRA)"),
        (
            {"args": SFTConfig(output_dir="x", model_init_kwargs=remote, bf16=False)},
            "model_init_kwargs={'trust_remote_code': True}",
        ),
    ):
        with pytest.raises(SystemExit):
            SFTTrainer(**{"model": "m", "args": config, "train_dataset": texts, **given})
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err
