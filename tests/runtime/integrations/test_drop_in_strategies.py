"""``logging_strategy="epoch"``, a callback's ``control.should_evaluate``,
``evaluate(metric_key_prefix=...)`` and ``use_cpu`` in the drop-in ``SFTTrainer``, against
TRL's own in the same process: a tiny Qwen2, 4 texts trained as one batch per step (so
the data order cannot matter), 3 epochs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]


def _run(trainer_class, folder: Path, out: Path) -> tuple[list[dict], dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig

    class EvaluateAtStepOne(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                control.should_evaluate = True

    words = "hello world how are you the user asks".split()
    texts = [{"text": " ".join(words[i : i + 3 + i])} for i in range(4)]
    config = SFTConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_train_epochs=3,
        learning_rate=1e-3,
        logging_strategy="epoch",
        logging_steps=2,  # ignored by the epoch strategy
        eval_strategy="no",
        report_to="none",
        bf16=False,
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=config,
        train_dataset=Dataset.from_list(texts),
        eval_dataset=Dataset.from_list(texts[:2]),
        callbacks=[EvaluateAtStepOne()],
        processing_class=_tokenizer(folder),
    )
    trainer.train()
    return trainer.state.log_history, trainer.evaluate(metric_key_prefix="test")


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def test_logging_strategy_epoch_and_metric_key_prefix(folder, tmp_path, monkeypatch) -> None:
    from trl import SFTTrainer as Reference

    from datacentric.integrations.trl import SFTTrainer

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    want_history, want = _run(Reference, folder, tmp_path / "ref")
    have_history, have = _run(SFTTrainer, folder, tmp_path / "ours")

    def logged(history, key):
        return [(r["step"], r[key]) for r in history if key in r]

    # one log per epoch (not every logging_steps), the same losses
    assert [s for s, _ in logged(have_history, "loss")] == [1, 2, 3]
    for (s, a), (t, b) in zip(
        logged(have_history, "loss"), logged(want_history, "loss"), strict=True
    ):
        assert s == t and a == pytest.approx(b, rel=1e-5)
    # the evaluation the callback asked for at step 1, and no other during training
    assert [s for s, _ in logged(have_history, "eval_loss")] == [1]
    assert logged(have_history, "eval_loss")[0][1] == pytest.approx(
        logged(want_history, "eval_loss")[0][1], rel=1e-5
    )
    assert set(have) >= {"test_loss", "test_runtime"} and "eval_loss" not in have
    assert have["test_loss"] == pytest.approx(want["test_loss"], rel=1e-5)
    # TRL's token count (TRL's log at step 1 lacks it: its evaluation there took it)
    tokens = dict(logged(have_history, "num_tokens"))
    assert tokens[1] == 24 and set(logged(want_history, "num_tokens")) <= set(tokens.items())
    # train()'s metrics as TRL's
    have_end, want_end = have_history[-2], want_history[-2]
    assert have_end["train_loss"] == pytest.approx(want_end["train_loss"], rel=1e-5)
    # transformers' floating_point_ops: 6 x non-embedding parameters x tokens (TRL's
    # batches also count their padding; the drop-in's packed steps have none)
    from transformers import AutoModelForCausalLM

    per_token = 6 * AutoModelForCausalLM.from_pretrained(folder).num_parameters(
        exclude_embeddings=True
    )
    assert have_end["total_flos"] == per_token * tokens[3] <= want_end["total_flos"]


def test_use_cpu_keeps_the_run_on_the_cpu(folder, tmp_path, monkeypatch, capfd) -> None:
    import torch
    from datasets import Dataset
    from trl import SFTConfig

    import datacentric.integrations.session as session
    from datacentric.integrations.trl import SFTTrainer
    from datacentric.parallel.groups import default_device

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    chosen = []
    real = session.process_groups

    def on_a_gpu_machine(timeout_s, device=None):
        with monkeypatch.context() as gpu:  # as on a GPU machine: cuda available
            gpu.setattr(torch.cuda, "is_available", lambda: True)
            chosen.append(default_device(device).type)
        return real(timeout_s, device)

    monkeypatch.setattr(session, "process_groups", on_a_gpu_machine)
    config = SFTConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=1,
        use_cpu=True,
        packing=True,
        gradient_checkpointing=True,
        report_to="none",
        bf16=False,
    )
    trainer = SFTTrainer(
        model=str(folder),
        args=config,
        train_dataset=Dataset.from_list([{"text": "hello world how are you"}] * 2),
    )
    trainer.train()
    assert chosen == ["cpu"] and trainer._trainer.config.parallelism.device == "cpu"
    # the notes the docs promise, logged once the run's handler exists
    err = capfd.readouterr().err
    assert "note: packing_strategy='bfd': the runtime packs its own micro-batches" in err
    assert "note: packing=" not in err  # packing=True is honoured: a batch in tokens
    assert "note: gradient_checkpointing=True: recomputation is the planner's decision" in err
    assert trainer.state.global_step == 1


def test_a_dict_of_eval_datasets(folder, tmp_path, monkeypatch) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig
    from trl import SFTTrainer as Reference

    from datacentric.integrations.trl import SFTTrainer

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    words = "hello world how are you the user asks".split()
    texts = [{"text": " ".join(words[i : i + 3 + i])} for i in range(4)]
    sets = {"a": Dataset.from_list(texts[:2]), "b": Dataset.from_list(texts[1:])}
    results = []
    for trainer_class, out in ((Reference, "ref"), (SFTTrainer, "ours")):
        config = SFTConfig(
            output_dir=str(tmp_path / out),
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            max_steps=2,
            learning_rate=1e-3,
            eval_strategy="steps",
            eval_steps=1,
            report_to="none",
            bf16=False,
        )
        trainer = trainer_class(
            model=AutoModelForCausalLM.from_pretrained(folder),
            args=config,
            train_dataset=Dataset.from_list(texts),
            eval_dataset=sets,
            processing_class=_tokenizer(folder),
        )
        trainer.train()
        history = list(trainer.state.log_history)  # before evaluate() adds to it
        metrics = trainer.evaluate()
        results.append(
            (
                [(r["step"], r["eval_a_loss"]) for r in history if "eval_a_loss" in r],
                [(r["step"], r["eval_b_loss"]) for r in history if "eval_b_loss" in r],
                metrics,
            )
        )
    (want_a, want_b, want), (have_a, have_b, have) = results
    assert [s for s, _ in have_a] == [s for s, _ in want_a] == [1, 2]
    for (_, x), (_, y) in zip(have_a + have_b, want_a + want_b, strict=True):
        assert x == pytest.approx(y, rel=1e-5)
    for key in ("eval_a_loss", "eval_b_loss"):
        assert have[key] == pytest.approx(want[key], rel=1e-5)


def _logged(
    trainer_class,
    folder: Path,
    out: Path,
    evaluate_first: bool = False,
    tokenizer: bool = True,
    **fields,
) -> list[dict]:
    """A run of 4 rows of one length, one batch a step, with ``fields`` (after an
    ``evaluate()``: ``evaluate_first``; no ``processing_class``: not ``tokenizer``): its
    log history, then the metrics ``train()`` returned."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainingArguments, default_data_collator

    rows = [{"input_ids": [(3 * i + k) % 40 + 3 for k in range(6)]} for i in range(4)]
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        **fields,
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=default_data_collator,
        train_dataset=Dataset.from_list([{**r, "labels": r["input_ids"]} for r in rows]),
        eval_dataset=Dataset.from_list([{**r, "labels": r["input_ids"]} for r in rows[:2]]),
        processing_class=_tokenizer(folder) if tokenizer else None,
    )
    if evaluate_first:  # its log is dropped when train() starts a new state
        trainer.evaluate()
    result = trainer.train()
    return [*trainer.state.log_history, result.metrics]  # train()'s metrics, last


def _same_logs(have: list[dict], want: list[dict]) -> None:
    """The same keys in each log, the same values but times and rates."""
    assert [sorted(r) for r in have] == [sorted(r) for r in want]

    def untimed(r: dict) -> dict:
        return {k: v for k, v in r.items() if not any(t in k for t in ("runtime", "per_sec"))}

    for mine, theirs in zip(have, want):
        assert untimed(mine) == pytest.approx(untimed(theirs), rel=1e-5)


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_include_num_input_tokens_seen_logs_them_as_transformers(
    folder, tmp_path, disable_tqdm
) -> None:
    """transformers logs ``num_input_tokens_seen`` (with a step's ``train_runtime`` and
    ``train_tokens_per_second``) when asked; the drop-in logged none of them. An
    ``evaluate()`` before ``train()`` leaves no log: train() starts a new state. With
    ``disable_tqdm`` (its default when transformers' logging is quieter than warnings)
    the PrinterCallback it adds pops ``total_flos`` from train()'s metrics; the drop-in
    returned them with it."""
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    fields = dict(max_steps=2, logging_steps=1, include_num_input_tokens_seen=True)
    fields |= dict(disable_tqdm=disable_tqdm)
    want = _logged(Reference, folder, tmp_path / "ref", evaluate_first=True, **fields)
    assert [r["num_input_tokens_seen"] for r in want] == [24, 48, 48, 48]  # 4 rows of 6
    assert "train_tokens_per_second" in want[0]
    _same_logs(_logged(Trainer, folder, tmp_path / "ours", evaluate_first=True, **fields), want)


def test_first_step_and_eval_delay(folder, tmp_path) -> None:
    """``logging_first_step`` and ``eval_delay``, which transformers' DefaultFlowCallback
    reads, and ``eval_on_start`` were refused; they log and evaluate at transformers'
    steps."""
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    fields = dict(
        max_steps=4,
        logging_steps=2,
        logging_first_step=True,
        eval_strategy="steps",
        eval_steps=1,
        eval_delay=3,
        eval_on_start=True,
    )
    want = _logged(Reference, folder, tmp_path / "ref", **fields)
    assert [r["step"] for r in want if "loss" in r] == [1, 2, 4]
    assert [r["step"] for r in want if "eval_loss" in r][:3] == [0, 3, 4]
    _same_logs(_logged(Trainer, folder, tmp_path / "ours", **fields), want)


def test_no_processing_class_takes_the_model_s_folder_s_tokenizer(folder, tmp_path) -> None:
    """transformers' Trainer trains tokenized rows with no tokenizer; the drop-in stopped
    ('give processing_class') for a model object loaded from a folder that holds one."""
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    fields = dict(max_steps=2, logging_steps=1, tokenizer=False)
    want = _logged(Reference, folder, tmp_path / "ref", **fields)
    _same_logs(_logged(Trainer, folder, tmp_path / "ours", **fields), want)
