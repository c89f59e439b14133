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
        out; ``preprocess_logits_for_metrics`` of them when given), the labels (-100: no
        loss; both padded with -100 to the longest record), ``<metric_key_prefix>_loss``
        (the mean over every loss token) and ``compute_metrics``' metrics, prefixed."""
        from transformers.trainer_utils import PredictionOutput

        if self._trained is None:
            stop(self.command, "predict(): train first (nothing trained yet)")
        records = self.records(test_dataset, self.processing_class)
        if not records:
            stop(self.command, "predict(test_dataset): no record has a token with loss")
        predictions, label_ids, loss = self._forward_records(records)
        metrics = {f"{metric_key_prefix}_loss": loss}
        metrics.update(self._metrics_of(predictions, label_ids, metric_key_prefix))
        self._hooks.predicted(len(records), metrics)
        return PredictionOutput(predictions=predictions, label_ids=label_ids, metrics=metrics)

    def _forward_records(self, records: list[dict[str, list[int]]]) -> tuple[Any, Any, float]:
        """``(predictions, label_ids, loss)`` of ``records`` under ``model``: each record
        forwarded alone (a batch of one: no padding enters the model, so nothing depends
        on ``per_device_eval_batch_size``), its logits [1, T, V] and labels [1, T] given
        to ``preprocess_logits_for_metrics`` when set, then concatenated over records
        padded with -100 to the longest, as transformers' evaluation loop concatenates
        its batches; the loss is the mean over every loss token."""
        import torch
        from transformers.trainer_pt_utils import nested_numpify

        model = self.model
        if not isinstance(model, torch.nn.Module):
            stop(
                self.command,
                f"model={model!r} is a folder name, not loaded before train(): train "
                "first, or give the model object",
            )
        device = next(model.parameters()).device
        preprocess = self.preprocess_logits_for_metrics
        predictions, label_ids, total, count = [], [], 0.0, 0
        model.eval()
        with torch.no_grad():
            for record in records:
                ids = torch.tensor([record["input_ids"]], device=device)
                labels_1T = torch.tensor([record["labels"]], device=device)
                logits_1TV = model(input_ids=ids).logits.float()
                total += float(
                    torch.nn.functional.cross_entropy(
                        logits_1TV[0, :-1], labels_1T[0, 1:], ignore_index=-100, reduction="sum"
                    )
                )
                count += int((labels_1T[0, 1:] != -100).sum())
                kept = logits_1TV if preprocess is None else preprocess(logits_1TV, labels_1T)
                predictions.append(nested_numpify(kept))
                label_ids.append(labels_1T.cpu().numpy())
        loss = total / max(1, count)
        return _concatenated(predictions), _concatenated(label_ids), loss

    def _computes_metrics(self) -> bool:
        """Whether ``compute_metrics`` is called (given, and ``prediction_loss_only``
        unset, as transformers)."""
        return self.compute_metrics is not None and not self.args.prediction_loss_only

    def _metrics_of(self, predictions: Any, label_ids: Any, prefix: str) -> dict[str, Any]:
        """``compute_metrics(EvalPrediction(predictions, label_ids))``, each name prefixed
        with ``<prefix>_`` as transformers names them (none: no compute_metrics, or
        ``prediction_loss_only``)."""
        from transformers.trainer_utils import EvalPrediction, denumpify_detensorize

        if not self._computes_metrics():
            return {}
        found = self.compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_ids))
        found = denumpify_detensorize(dict(found))
        return {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in found.items()}

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


def _concatenated(parts: list[Any]) -> Any:
    """The records' arrays (or nested tuples/dicts of them) concatenated on the first
    axis, each padded with -100 to the longest on the second, by transformers'
    ``nested_concat``, pairwise in a balanced tree (each element copied log2(records)
    times, not once per record)."""
    from transformers.trainer_pt_utils import nested_concat

    while len(parts) > 1:
        parts = [
            nested_concat(*parts[i : i + 2], padding_index=-100) if i + 1 < len(parts) else parts[i]
            for i in range(0, len(parts), 2)
        ]
    return parts[0]
