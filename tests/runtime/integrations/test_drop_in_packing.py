"""``SFTConfig(packing=True)`` in the drop-in ``SFTTrainer``: a step holds about the
tokens of TRL's packed step (per_device_train_batch_size x gradient_accumulation_steps x
world rows of ``max_length`` tokens), so an epoch takes about TRL's steps, counted from
the run's own global batches; against TRL's own trainer on the same texts."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]
MAX_LENGTH, BATCH = 32, 2


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _texts() -> list[dict[str, str]]:
    """24 texts of 1 to 14 words."""
    words = "hello world how are you the user asks and the assistant answers briefly".split()
    lengths = [1 + (i * 5) % 14 for i in range(24)]
    return [
        {"text": " ".join(words[(i + k) % len(words)] for k in range(n))}
        for i, n in enumerate(lengths)
    ]


def _trainer(trainer_class, folder: Path, out: Path, callbacks=(), **fields):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    config = SFTConfig(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        max_length=MAX_LENGTH,
        num_train_epochs=1,
        logging_steps=1,
        include_num_input_tokens_seen=True,
        report_to="none",
        bf16=False,
        use_cpu=True,
        **fields,
    )
    return trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=config,
        train_dataset=Dataset.from_list(_texts()),
        processing_class=AutoTokenizer.from_pretrained(folder),
        callbacks=list(callbacks),
    )


def test_packing_steps_as_trl_in_tokens(folder, tmp_path, monkeypatch) -> None:
    """TRL packs the 24 texts into rows of 32 tokens and steps 2 rows at a time; the
    drop-in counted 2 samples a step (12 steps, several times TRL's). Now a step holds at
    most 2 x 32 tokens and an epoch takes TRL's steps, give or take one."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTTrainer as Reference

    from datacentric.integrations.arguments import training_settings
    from datacentric.integrations.trl import SFTTrainer

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    reference = _trainer(Reference, folder, tmp_path / "ref", packing=True)
    want = len(reference.get_train_dataloader())  # TRL's steps of the epoch (no accumulation)
    rows = len(reference.train_dataset)
    assert want == math.ceil(rows / BATCH) and rows < len(_texts()) / 2  # rows pack texts

    class StepTokens(TrainerCallback):
        seen: list[int] = []

        def on_step_end(self, args, state, control, **kw):
            self.seen.append(state.num_input_tokens_seen)

    ours = _trainer(SFTTrainer, folder, tmp_path / "ours", [StepTokens()], packing=True)
    ours.train()
    assert abs(ours.state.global_step - want) <= 1, (ours.state.global_step, want, rows)
    assert ours.state.max_steps == ours.state.global_step
    assert ours.state.epoch == pytest.approx(1.0)
    steps = [b - a for a, b in zip([0, *StepTokens.seen], StepTokens.seen, strict=False)]
    assert len(steps) == ours.state.global_step
    # the runtime cuts an epoch into ceil(total / budget) global batches of nearly equal
    # tokens, every sample whole: on average at most the budget, each above it by less
    # than the sample its cut falls in
    budget, longest = (
        BATCH * MAX_LENGTH,
        max(
            len(r["input_ids"])
            for r in ours.records(Dataset.from_list(_texts()), ours.processing_class)
        ),
    )
    assert sum(steps) / len(steps) <= budget and max(steps) < budget + longest, steps
    # packing=False still counts samples: 2 texts a step
    args = _trainer(Reference, folder, tmp_path / "plain").args
    tokens = [MAX_LENGTH] * len(_texts())
    assert training_settings(args, world=1, tokens=tokens)["scheduling"] == {
        "global_batch_samples": BATCH,
        "drop_remainder": False,
    }


def test_packing_without_max_length_is_refused_in_one_line(folder, tmp_path, capsys) -> None:
    """TRL packs rows of max_length tokens and refuses packing=True without one; so does
    the drop-in, whose global batch is as many tokens."""
    from datacentric.integrations.trl import SFTTrainer

    trainer = _trainer(SFTTrainer, folder, tmp_path / "ours", packing=True)
    trainer.args.max_length = None
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("datacentric SFTTrainer: packing=True with max_length=None")
