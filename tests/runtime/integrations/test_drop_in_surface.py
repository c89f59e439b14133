"""The drop-in ``Trainer`` against transformers' own on a script in the style of
``run_clm.py``: tokenized rows (right-padded for transformers, left-padded for the
drop-in), ``DataCollatorForLanguageModeling(mlm=False)``, ``weight_decay``,
``lr_scheduler_type="cosine"``, ``eval_strategy="epoch"``, ``save_steps=2``, a callback
recording every event, then the script's epilogue (``evaluate``, ``log_metrics``, ``save_metrics``,
``save_state``, ``save_model(args.output_dir)``) and ``get_last_checkpoint``. One process,
a tiny Qwen2, 4 rows trained as one batch per step (so the data order cannot matter).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]
STEPS = 3


def _recorder():
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.seen: list[tuple] = []

        def __getattribute__(self, name):
            if name.startswith("on_"):

                def record(args, state, control, **kw):
                    # the keywords each event passes, and which of them hold something
                    # (the data loaders: None in the drop-in, which has none)
                    held = tuple(
                        sorted(k for k, v in kw.items() if v is not None and "loader" not in k)
                    )
                    self.seen.append(
                        (name, state.global_step, state.is_world_process_zero, sorted(kw), held)
                    )

                return record
            return object.__getattribute__(self, name)

    return Recorder()


def _script(trainer_class, folder: Path, out: Path, left: bool, **extra):
    """run_clm.py's pattern with ``trainer_class``; the trainer, its train() result, its
    evaluate() metrics and the recorder."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        TrainingArguments,
    )

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    rows = []
    for i in range(4):
        ids = [(5 * i + k) % 40 + 3 for k in range(4 + 2 * i)]
        pad = [tokenizer.pad_token_id] * (10 - len(ids))
        mask = [0] * len(pad)
        if left:  # as a left-padding tokenizer leaves them
            rows.append({"input_ids": pad + ids, "attention_mask": mask + [1] * len(ids)})
        else:
            rows.append({"input_ids": ids + pad, "attention_mask": [1] * len(ids) + mask})
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        per_device_eval_batch_size=2,
        max_steps=STEPS,
        learning_rate=1e-3,
        weight_decay=0.1,
        adam_epsilon=1e-4,  # a step's size moves with it
        lr_scheduler_type="cosine",
        warmup_steps=1,
        logging_steps=1,
        eval_strategy="epoch",
        save_steps=2,
        report_to="none",
        bf16=False,
        use_cpu=True,
        **extra,
    )
    recorder = _recorder()
    trainer = trainer_class(
        model=model,
        args=args,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:2]),
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    result = trainer.train()
    metrics = trainer.evaluate(metric_key_prefix="test")
    trainer.prediction = trainer.predict(trainer.eval_dataset)
    return trainer, result, metrics, recorder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import os

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    tmp = tmp_path_factory.mktemp("surface")
    os.environ["DATACENTRIC_CACHE"] = str(tmp / "cache")
    folder = save_tiny_qwen2(tmp / "qwen2")
    # transformers' models place a left-padded row's tokens at the positions after the
    # padding (a rotary model's loss then differs): the reference is right-padded; the
    # drop-in, given the same rows left-padded, trains on the same tokens
    reference = _script(Reference, folder, tmp / "ref", left=False)
    return folder, reference, _script(Trainer, folder, tmp / "ours", left=True)


def test_the_script_epilogue_and_trainer_surface(runs, capsys) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint

    folder, (ref, ref_result, ref_metrics, _), (ours, result, metrics, _) = runs
    # losses and the prefixed held-out loss, as transformers'
    want = [r["loss"] for r in ref.state.log_history if "loss" in r]
    have = [r["loss"] for r in ours.state.log_history if "loss" in r]
    assert have == pytest.approx(want, rel=1e-5)
    rates = [r["learning_rate"] for r in ours.state.log_history if "loss" in r]
    assert rates == pytest.approx(
        [r["learning_rate"] for r in ref.state.log_history if "loss" in r], rel=1e-6
    )
    assert len(set(rates)) == STEPS  # the cosine moved it at every step
    assert metrics["test_loss"] == pytest.approx(ref_metrics["test_loss"], rel=1e-5)
    assert set(metrics) == set(ref_metrics) and metrics["epoch"] == ref_metrics["epoch"]
    assert "eval_loss" not in metrics
    evals = [r["eval_loss"] for r in ours.state.log_history if "eval_loss" in r]
    assert evals == pytest.approx(
        [r["eval_loss"] for r in ref.state.log_history if "eval_loss" in r], rel=1e-5
    )
    for key in (
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "train_loss",
    ):
        assert key in result.metrics and key in ours.state.log_history[-2]
    assert result.metrics["train_loss"] == pytest.approx(ref_result.metrics["train_loss"], rel=1e-5)
    # total_flos: in the logged summary; in train()'s metrics as in transformers' (its
    # PrinterCallback, added under disable_tqdm, pops it from them)
    assert ours.state.log_history[-2]["total_flos"] > 0
    assert ("total_flos" in result.metrics) == ("total_flos" in ref_result.metrics)
    # trainer.model: trained, every tensor (norm weights and biases: no decay) as transformers'
    assert ours.model is ours.model_wrapped
    want_state = ref.model.state_dict()
    for name, tensor in ours.model.state_dict().items():
        torch_close(tensor, want_state[name], name)
    assert ours.optimizer is not None and len(ours.get_learning_rates()) == 2
    assert ours.lr_scheduler.get_last_lr() == pytest.approx(ref.lr_scheduler.get_last_lr())
    # predict(): logits of the real tokens as transformers' (right-padded rows), labels exact
    want_out, have_out = ref.prediction, ours.prediction
    real = have_out.label_ids != -100
    width = have_out.label_ids.shape[1]
    assert (have_out.label_ids[real] == want_out.label_ids[:, :width][real]).all()
    assert (want_out.label_ids[:, width:] == -100).all()
    torch_close(
        _tensor(have_out.predictions[real]),
        _tensor(want_out.predictions[:, :width][real]),
        "logits",
    )
    assert have_out.metrics["test_loss"] == pytest.approx(want_out.metrics["test_loss"], rel=1e-5)
    # checkpoints a script finds, the epilogue's files
    out = Path(ours.args.output_dir)
    assert get_last_checkpoint(str(out)) == str(out / f"checkpoint-{STEPS}")
    assert (out / "checkpoint-2").is_dir()
    ours.log_metrics("test", metrics)
    assert "test_loss" in capsys.readouterr().out
    ours.save_metrics("test", metrics)
    ours.save_state()
    ours.save_model(ours.args.output_dir)
    assert json.loads((out / "test_results.json").read_text())["test_loss"] == metrics["test_loss"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == STEPS
    saved = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in saved.state_dict().items():
        torch_close(tensor, want_state[name], name)
    assert (out / "tokenizer_config.json").exists() and (out / "run" / "config.json").exists()
    ours.create_model_card()
    assert (out / "README.md").exists()
    assert ours.is_world_process_zero() and ours.is_local_process_zero()
    assert ours.get_total_train_batch_size() == 4  # 2 x 2 accumulated
    assert ours.get_num_trainable_parameters() == sum(p.numel() for p in saved.parameters())
    capsys.readouterr()
    with pytest.raises(SystemExit):  # training again is refused naming train()
        ours.train()
    assert "train() ran already on this trainer" in capsys.readouterr().err


def test_every_callback_event_as_transformers_fires_it(runs) -> None:
    _, (_, _, _, want), (_, _, _, have) = runs
    names = {seen[0] for seen in have.seen}
    assert {"on_init_end", "on_substep_end", "on_prediction_step", "on_epoch_end"} <= names
    assert have.seen == want.seen


def _tensor(array):
    import torch

    return torch.from_numpy(array)


def torch_close(a, b, name) -> None:
    import torch

    torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)


def _frozen_run(trainer_class, folder: Path, out: Path):
    """2 steps of a model whose embeddings and first block are frozen: its weights, and
    which of them the run moved."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for name, param in model.named_parameters():
        param.requires_grad_(not ("embed" in name or "layers.0." in name))
    rows = [{"input_ids": [(3 * i + k) % 40 + 3 for k in range(8)]} for i in range(4)]
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
    )
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([{**r, "labels": r["input_ids"]} for r in rows]),
        processing_class=AutoTokenizer.from_pretrained(folder),
    )
    trainer.train()
    state = trainer.model.state_dict()
    return state, sorted(k for k, v in state.items() if not torch.equal(v, before[k]))


def test_frozen_parameters_stay_frozen_as_transformers_leaves_them(runs, tmp_path) -> None:
    """A model object's parameters with ``requires_grad=False`` are left out of the
    optimizer by transformers; the drop-in trained them (it saves and reloads the model)."""
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    folder = runs[0]
    want, want_moved = _frozen_run(Reference, folder, tmp_path / "ref")
    have, moved = _frozen_run(Trainer, folder, tmp_path / "ours")
    assert moved == want_moved and not any("embed" in k or "layers.0." in k for k in moved)
    for name, tensor in have.items():
        torch_close(tensor, want[name], name)
