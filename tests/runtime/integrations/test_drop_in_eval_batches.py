"""``eval_loss`` as transformers computes it: the mean of its eval batches' losses (of
``per_device_eval_batch_size`` rows), each counted once per row, not the mean over every
loss token of the set. One process against transformers' ``Trainer`` (a tiny Qwen2, 5
held-out rows of other lengths in batches of 2); on 2 ranks, the weights against
transformers' own arithmetic over accelerate's shards of the batches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

TESTS = Path(__file__).resolve().parents[2]


def _rows(count: int, start: int) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": [(3 * i + k) % 40 + 3 for k in range(3 + (2 * i) % 7)]}
        for i in range(start, start + count)
    ]


def _evaluations(trainer_class, folder: Path, out: Path) -> list[tuple[int, float]]:
    """The eval losses of a 2-step run (each step the whole training set) and of
    evaluate() after it."""
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=2,
        max_steps=2,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=1,
        report_to="none",
        use_cpu=True,
    )
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        train_dataset=Dataset.from_list(_rows(4, 0)),
        eval_dataset=Dataset.from_list(_rows(5, 4)),
        processing_class=tokenizer,
    )
    trainer.train()
    during = [(r["step"], r["eval_loss"]) for r in trainer.state.log_history if "eval_loss" in r]
    return [*during, (-1, trainer.evaluate()["eval_loss"])]


def test_eval_loss_is_the_mean_of_transformers_eval_batches(tmp_path, monkeypatch) -> None:
    from transformers import Trainer as Reference

    from datacentric.integrations.transformers import Trainer

    sys.path.insert(0, str(TESTS))
    from chat_data import save_tiny_qwen2

    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_qwen2(tmp_path / "qwen2")
    want = _evaluations(Reference, folder, tmp_path / "ref")
    have = _evaluations(Trainer, folder, tmp_path / "ours")
    assert [s for s, _ in have] == [s for s, _ in want] == [1, 2, -1]
    assert [x for _, x in have] == pytest.approx([x for _, x in want], rel=1e-6)


@pytest.mark.parametrize(
    ("samples", "batch", "world"), [(5, 2, 2), (3, 8, 2), (11, 3, 2), (7, 2, 3)]
)
def test_the_weights_give_transformers_gathered_mean(samples, batch, world) -> None:
    """transformers' loop on ``world`` ranks, simulated: accelerate's shards of the
    sequential batches, each rank's loss its summed loss x world over the round's loss
    tokens, repeated by its batch size, gathered, the last round cut to the remainder,
    NaNs (a round with no loss token) left out, then the mean."""
    import random

    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    from datacentric.integrations.eval_batches import batch_mean_weights

    rng = random.Random(samples * 100 + batch)
    tokens = {s: rng.choice([0, 1, 3, 7]) for s in range(samples)}
    summed = {s: rng.uniform(0.5, 3.0) * tokens[s] for s in range(samples)}
    sampler = BatchSampler(SequentialSampler(range(samples)), batch, drop_last=False)
    shards = [
        list(BatchSamplerShard(sampler, num_processes=world, process_index=r)) for r in range(world)
    ]
    gathered: list[float] = []
    rounds = list(zip(*shards))
    for index, batches in enumerate(rounds):
        count = sum(tokens[s] for rows in batches for s in rows)
        values = []
        for rows in batches:
            loss = world * sum(summed[s] for s in rows) / count if count else float("nan")
            values += [loss] * len(batches[0])
        if index == len(rounds) - 1 and samples % (batch * world):
            values = values[: samples % (batch * world)]
        gathered += values
    kept = [v for v in gathered if v == v]
    want = sum(kept) / len(kept)
    weights = batch_mean_weights(tokens, batch, world, "token").token_weight
    assert sum(weights[s] * summed[s] for s in summed) == pytest.approx(want, rel=1e-12)
