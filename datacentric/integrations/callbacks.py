"""transformers' ``TrainerCallback`` events from the trainer's hooks
(:mod:`datacentric.train.hooks`): ``on_train_begin``, ``on_step_end``, ``on_log`` (every
``logging_steps``, the mean loss since the last log), ``on_evaluate`` (a held-out loss,
as ``eval_loss``), ``on_save`` and ``on_train_end``, with a ``TrainerState`` and a
``TrainerControl`` whose ``should_training_stop`` and ``should_save`` the trainer
honours after the step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from datacentric.train.hooks import StepControl, StepHooks


class CallbackHooks(StepHooks):
    """The trainer's hooks calling ``callbacks`` (transformers' ``TrainerCallback``)."""

    def __init__(self, args: Any, state: Any, control: Any, callbacks: list, *, per_epoch: int):
        self.args, self.state, self.control, self.callbacks = args, state, control, callbacks
        self.per_epoch = per_epoch
        self.log_every = (
            int(args.logging_steps) if str(_plain(args.logging_strategy)) != "no" else 0
        )
        self.pending: list[float] = []
        self.objects: dict[str, Any] = {}
        """What each event passes as keyword arguments (model, processing_class)."""

    def event(self, name: str, **extra: Any) -> None:
        """Call ``name`` on every callback (their returned control, if any, is kept)."""
        for callback in self.callbacks:
            answer = getattr(callback, name)(
                self.args, self.state, self.control, **self.objects, **extra
            )
            if answer is not None:
                self.control = answer

    def log(self, logs: dict[str, float]) -> None:
        """``on_log`` with ``logs`` (and the epoch, step), kept in ``state.log_history``."""
        logs = {**logs, "epoch": self.state.epoch}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.event("on_log", logs=logs)

    def evaluated(self, loss: float) -> dict[str, float]:
        """``on_evaluate`` (and ``on_log``) with a held-out loss; the metrics."""
        metrics = {"eval_loss": loss}
        self.log(metrics)
        self.event("on_evaluate", metrics=metrics)
        return metrics

    def train_begin(self, done: int, total: int) -> None:
        self.state.global_step, self.state.max_steps = done, total
        self.state.epoch = done / self.per_epoch
        self.state.num_train_epochs = math.ceil(total / self.per_epoch)
        self.event("on_train_begin")

    def step_end(self, record: dict[str, Any]) -> StepControl:
        self.state.global_step = record["iteration"] + 1
        self.state.epoch = self.state.global_step / self.per_epoch
        self.pending.append(float(record["loss"]))
        self.event("on_step_end")
        due = self.log_every and self.state.global_step % self.log_every == 0
        if due or self.state.global_step == self.state.max_steps or self.control.should_log:
            loss = sum(self.pending) / len(self.pending)
            self.log(
                {
                    "loss": loss,
                    "grad_norm": float(record.get("grad_norm", math.nan)),
                    "learning_rate": float(record["lr"]),
                }
            )
            self.pending.clear()
        if "val_loss" in record:
            self.evaluated(float(record["val_loss"]))
        control = StepControl(
            stop=bool(self.control.should_training_stop), save=bool(self.control.should_save)
        )
        self.control.should_save = self.control.should_log = False
        self.control.should_evaluate = False
        return control

    def saved(self, step: int, folder: Path) -> None:
        self.event("on_save")

    def train_end(self, done: int) -> None:
        self.event("on_train_end")


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)
