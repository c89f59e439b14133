"""The TRL quickstart pattern against local files, for the drop-in trainers' tests.

``python sft_script.py FOLDER OUT WHICH KINDS`` (or under ``torchrun``): ``WHICH`` is
``trl`` (TRL's own ``SFTTrainer`` / transformers' ``Trainer``) or ``datacentric`` (the
drop-ins: the only difference is the import), ``KINDS`` a comma list of ``text``,
``chat`` (assistant-only loss), ``prompt`` (prompt-completion), ``tokens`` (a tokenized
causal-LM dataset with labels -100, transformers' ``Trainer``) and ``lora`` (the
quickstart: conversations, a ``LoraConfig``, a callback, ``save_model``; 4 steps). ``FOLDER``
holds a tiny Qwen2 with a chat template. Prints one line per kind, ``RESULT`` and a
JSON object: the losses logged at each step (with TRL's ``num_tokens``,
``mean_token_accuracy`` and ``entropy``), ``eval_loss`` and the callback events.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: chat_data

from chat_data import WORDS, conversations  # noqa: E402


def rows(kind: str, count: int, start: int) -> list[dict]:
    """``count`` records of ``kind`` (varied lengths), from record ``start`` on."""
    words = WORDS.split()

    def text(i: int, n: int) -> str:
        return " ".join(words[(3 * i + k) % len(words)] for k in range(n))

    ids = range(start, start + count)
    if kind == "text":
        return [{"text": text(i, 3 + (5 * i) % 11)} for i in ids]
    if kind in ("chat", "lora"):
        return [{"messages": m} for m in conversations(start + count)[start:]]
    if kind == "prompt":
        return [
            {"prompt": text(i, 2 + i % 4), "completion": " " + text(i + 1, 1 + (3 * i) % 6)}
            for i in ids
        ]
    return [{"input_ids": [(7 * i + k) % 250 + 3 for k in range(4 + (5 * i) % 9)]} for i in ids]


def with_labels(row: dict) -> dict:
    """A tokenized row with labels -100 on its first third."""
    ids = row["input_ids"]
    cut = len(ids) // 3
    return {"input_ids": ids, "labels": [-100] * cut + ids[cut:]}


class Recorder:
    """A ``TrainerCallback`` that counts its events (built lazily: transformers' class)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Recorder(TrainerCallback):
            def __init__(self):
                self.events: dict[str, int] = {}

            def _seen(self, name):
                self.events[name] = self.events.get(name, 0) + 1

            def on_train_begin(self, args, state, control, **kw):
                self._seen("on_train_begin")

            def on_step_end(self, args, state, control, **kw):
                self._seen("on_step_end")

            def on_log(self, args, state, control, logs=None, **kw):
                self._seen("on_log")

            def on_evaluate(self, args, state, control, metrics=None, **kw):
                self._seen("on_evaluate")

            def on_save(self, args, state, control, **kw):
                self._seen("on_save")

            def on_train_end(self, args, state, control, **kw):
                self._seen("on_train_end")

        return _Recorder()


def run(folder: Path, out: Path, which: str, kind: str, world: int) -> dict:
    """One training run of ``kind``; what it logged."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if which == "trl":
        from transformers import Trainer
        from trl import SFTConfig, SFTTrainer
    else:
        from trl import SFTConfig

        from datacentric.integrations.transformers import Trainer
        from datacentric.integrations.trl import SFTTrainer
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    train, held = rows(kind, 4, 0), rows(kind, 4, 4)
    recorder = Recorder()
    settings = dict(
        output_dir=str(out / f"{which}-{kind}"),
        per_device_train_batch_size=4 // world,
        # one round of eval batches on 1 rank or 2: transformers' eval_loss is then the
        # mean over every loss token of the set on either
        per_device_eval_batch_size=4 // world,
        num_train_epochs=2,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="no",
        report_to="none",
        bf16=False,
    )
    if kind == "lora":  # 4 steps at a rate that makes some predictions right by the third
        settings.update(num_train_epochs=4, learning_rate=5e-2)
    if kind == "tokens":
        from transformers import DataCollatorForSeq2Seq, TrainingArguments

        trainer = Trainer(
            model=model,
            args=TrainingArguments(**settings),
            data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
            train_dataset=Dataset.from_list([with_labels(r) for r in train]),
            eval_dataset=Dataset.from_list([with_labels(r) for r in held]),
            processing_class=tokenizer,
            callbacks=[recorder],
        )
    else:
        peft_config = None
        if kind == "lora":
            from peft import LoraConfig

            peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
        config = SFTConfig(**settings, assistant_only_loss=kind in ("chat", "lora"))
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(train),
            eval_dataset=Dataset.from_list(held),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[recorder],
        )
    trainer.train()
    metrics = trainer.evaluate()
    logged = [r for r in trainer.state.log_history if "loss" in r]
    losses = [r["loss"] for r in logged]
    token_metrics = ("num_tokens", "mean_token_accuracy", "entropy")
    saved = None
    if kind == "lora":
        saved = str(out / f"{which}-adapter")
        trainer.save_model(saved)
    import os

    rank = int(os.environ.get("RANK", "0"))
    assert trainer.state.is_world_process_zero == (rank == 0) == trainer.is_world_process_zero()
    return {
        "kind": kind,
        "losses": losses,
        "token_metrics": [{k: r[k] for k in token_metrics if k in r} for r in logged],
        "eval_loss": metrics["eval_loss"],
        "events": recorder.events,
        "saved": saved,
        "model": type(trainer.model).__name__,
    }


def main() -> None:
    import os

    folder, out, which, kinds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for kind in kinds.split(","):
        result = run(folder, out, which, kind, world)
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
