"""The methods of transformers' ``Trainer`` that a script calls around ``train()`` (its
epilogue: ``log_metrics``, ``save_metrics``, ``save_state``, ``predict``...), on the
drop-in trainers (:class:`ScriptMethods` is a base of
:class:`~datacentric.integrations.session.DropInTrainer`); transformers' own helpers
format and write where it has them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datacentric.integrations.outputs import run_folder
from datacentric.integrations.stops import ends_in_one_line, stop
from datacentric.parallel.launch import launch_mode


class ScriptMethods:
    """What a drop-in trainer answers besides training (``args``, ``state``,
    ``callbacks``, ``model`` and the run are the trainer's)."""

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (a class is instantiated)."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove ``callback`` (an object, or the first of a class) and return it
        (None: not there)."""
        for index, have in enumerate(self.callbacks):
            if have is callback or (isinstance(callback, type) and isinstance(have, callback)):
                return self.callbacks.pop(index)
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove ``callback`` (an object, or the first of a class)."""
        self.pop_callback(callback)

    def is_world_process_zero(self) -> bool:
        """True on the first rank of the job only."""
        return int(os.environ.get("RANK", "0")) == 0

    def is_local_process_zero(self) -> bool:
        """True on the first rank of each node only."""
        return int(os.environ.get("LOCAL_RANK", "0")) == 0

    @ends_in_one_line("predict()")
    def predict(
        self, test_dataset: Any, ignore_keys: Any = None, metric_key_prefix: str = "test"
    ) -> Any:
        """transformers' ``PredictionOutput`` of ``test_dataset`` under the trained model:
        the logits of each record (its tokens as the drop-in trains them, padding left
        out), the labels (-100: no loss; both padded with -100 to the longest record) and
        ``<metric_key_prefix>_loss`` (the mean over every loss token)."""
        import numpy as np
        import torch
        from transformers.trainer_utils import PredictionOutput

        if self._trained is None:
            stop(self.command, "predict(): train first (nothing trained yet)")
        records = self.records(test_dataset, self.processing_class)
        if not records:
            stop(self.command, "predict(test_dataset): no record has a token with loss")
        longest = max(len(r["input_ids"]) for r in records)
        logits_all, labels_all, total, count = [], [], 0.0, 0
        self.model.eval()
        with torch.no_grad():
            for record in records:
                ids = torch.tensor([record["input_ids"]])
                labels = torch.tensor(record["labels"])
                logits = self.model(input_ids=ids).logits[0].float()
                total += float(
                    torch.nn.functional.cross_entropy(
                        logits[:-1], labels[1:], ignore_index=-100, reduction="sum"
                    )
                )
                count += int((labels[1:] != -100).sum())
                pad = longest - len(labels)
                logits_all.append(torch.nn.functional.pad(logits, (0, 0, 0, pad), value=-100))
                labels_all.append(torch.nn.functional.pad(labels, (0, pad), value=-100))
        metrics = {f"{metric_key_prefix}_loss": total / max(1, count)}
        self._hooks.predicted(len(records), metrics)
        return PredictionOutput(
            predictions=np.stack([t.numpy() for t in logits_all]),
            label_ids=np.stack([t.numpy() for t in labels_all]),
            metrics=metrics,
        )

    @ends_in_one_line("save_state()")
    def save_state(self) -> None:
        """``trainer_state.json`` in ``output_dir`` (rank 0)."""
        from transformers.trainer_pt_utils import save_state

        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        save_state(self)

    @ends_in_one_line("log_metrics()")
    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print ``metrics`` as transformers prints them (rank 0)."""
        from transformers.trainer_pt_utils import log_metrics

        log_metrics(self, split, metrics)

    @ends_in_one_line("save_metrics()")
    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """``<split>_results.json`` (and ``all_results.json``) in ``output_dir`` (rank 0)."""
        from transformers.trainer_pt_utils import save_metrics

        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        save_metrics(self, split, metrics, combined)

    def metrics_format(self, metrics: dict[str, float]) -> dict[str, Any]:
        """``metrics`` formatted as transformers formats them."""
        from transformers.trainer_pt_utils import metrics_format

        return metrics_format(metrics)

    @ends_in_one_line("create_model_card()")
    def create_model_card(self, **fields: Any) -> None:
        """A ``README.md`` in ``output_dir`` naming the base model, the data and the
        settings (rank 0)."""
        if not self.is_world_process_zero():
            return
        base = self.model if isinstance(self.model, str | Path) else type(self.model).__name__
        lines = [
            f"# {fields.get('model_name') or Path(self.args.output_dir).name}",
            "",
            f"Fine-tuned from `{fields.get('finetuned_from') or base}` with datacentric's "
            f"drop-in `{self.command}`{' (LoRA)' if self.peft_config is not None else ''}.",
            "",
            f"- steps: {self.state.global_step}; epochs: {self.state.epoch}",
            f"- settings: `{run_folder(self.args.output_dir) / 'config.json'}`",
        ]
        out = Path(self.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def get_learning_rates(self) -> list[float]:
        """The optimizer's learning rate per parameter group (after ``train()``)."""
        if self.optimizer is None:
            stop(self.command, "get_learning_rates(): train first (no optimizer yet)")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_decay_parameter_names(self, model: Any) -> list[str]:
        """transformers' own: the parameter names weight decay applies to."""
        from transformers import Trainer as Reference

        return Reference.get_decay_parameter_names(self, model)

    def get_total_train_batch_size(self, args: Any = None) -> int:
        """The global batch in samples (per device x accumulation x world)."""
        args = args or self.args
        world = launch_mode().world_size
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * world
