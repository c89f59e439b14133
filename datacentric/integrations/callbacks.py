"""transformers' ``TrainerCallback`` events from the trainer's hooks
(:mod:`datacentric.train.hooks`), in the order transformers' ``Trainer`` fires them, with
a ``TrainerState`` and a ``TrainerControl`` filled as transformers fills them.

The first callback is transformers' own ``DefaultFlowCallback``: it sets
``control.should_log`` / ``should_evaluate`` / ``should_save`` /
``should_training_stop`` from the ``*_strategy`` and ``*_steps`` arguments, as in
transformers; every flag, whoever set it, is then honoured: a log (the mean loss since
the last one), an evaluation (the held-out loss, ``eval_loss``), a checkpoint (the
runtime saves after the step; ``checkpoint-N`` links it into ``output_dir``), a stop.
With ``metric_for_best_model`` each evaluation during training updates
``state.best_metric`` and ``best_global_step`` after its ``on_evaluate`` (so
``EarlyStoppingCallback`` compares with the best before it), and the save of that step
``best_model_checkpoint``, as transformers keeps them.
The events of a step (``on_step_begin``, ``on_substep_end`` once per accumulated
micro-batch of ``gradient_accumulation_steps``, ``on_pre_optimizer_step``,
``on_optimizer_step``, ``on_step_end``) are fired after the runtime's step ran, in
transformers' order; ``on_prediction_step`` once per eval batch of
``per_device_eval_batch_size`` on each rank, as transformers counts them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from datacentric.integrations.arguments import best_metric_key, lr_factor, unknown_best_metric
from datacentric.integrations.outputs import (
    BEST,
    checkpoint_of,
    keep_state,
    kept_state,
    link_checkpoint,
)
from datacentric.train.hooks import StepControl, StepHooks


class CallbackHooks(StepHooks):
    """The trainer's hooks calling ``callbacks`` (transformers' ``TrainerCallback``)."""

    def __init__(
        self,
        args: Any,
        state: Any,
        control: Any,
        callbacks: list,
        *,
        per_epoch: int,
        epoch_batches: int = 0,
        evaluate: Callable[[], list[tuple[str, float, float]]] | None = None,
        world: int = 1,
        token_metrics: bool = False,
        flops_per_token: float = 0.0,
    ):
        self.args, self.state, self.control, self.callbacks = args, state, control, callbacks
        self.per_epoch = per_epoch
        self.epoch_batches = epoch_batches
        """transformers' micro-batches of an epoch on a rank, which its ``state.epoch``
        counts (:func:`.arguments.epoch_batches`; 0: count the epoch by steps)."""
        self.epoch_index = 0
        """The runtime's epoch (0-based) of the last step, and its steps run so far."""
        self.in_epoch = 0
        self.evaluate = evaluate
        """``(metric prefix, held-out loss, seconds)`` of each eval set under the model as
        it is now (collective); None: no set."""
        self.world = world
        self.eval_samples: dict[str, int] = {}
        """The samples of each eval set, by metric prefix (``eval``, ``eval_<name>``)."""
        self.token_metrics = token_metrics
        self.flops_per_token = flops_per_token
        self.pending: list[float] = []
        self.pending_tokens: list[tuple[float, float]] = []
        """Each step's ``(mean_token_accuracy, entropy)`` since the last log."""
        self.losses: list[float] = []
        self.tokens_seen = 0
        self.tokens_before = 0
        """The tokens seen before this call of ``train()`` (a resume's)."""
        self.tokens_at: dict[int, int] = {}
        """The tokens seen by each step (what a checkpoint of the step keeps)."""
        self.started = 0.0
        self.samples = 0
        self.metrics: dict[str, float] = {}
        """``train()``'s metrics (train_runtime, ..., train_loss), logged at the end."""
        self.last: dict[str, Any] = {}
        """The last step's record (what an epoch's log reports)."""
        self.save_asked: set[int] = set()
        self.epoch_end_after_save = False
        self.objects: dict[str, Any] = dict.fromkeys(
            ("model", "processing_class", "optimizer", "lr_scheduler")
        )
        """What each event passes as keyword arguments, as transformers passes them (the
        data loaders: None, the runtime has none)."""
        self.run: Any = None
        """The run's trainer once built (its learning-rate schedule: ``lr_scheduler``)."""

    def event(self, name: str, **extra: Any) -> None:
        """Call ``name`` on every callback (their returned control, if any, is kept)."""
        objects = {
            **self.objects,
            "train_dataloader": None,
            "eval_dataloader": None,
            "lr_scheduler": getattr(self.run, "scheduler", self.objects["lr_scheduler"]),
        }
        for callback in self.callbacks:
            answer = getattr(callback, name)(
                self.args, self.state, self.control, **objects, **extra
            )
            if answer is not None:
                self.control = answer

    def log(self, logs: dict[str, float], started: float | None = None) -> None:
        """``on_log`` with ``logs`` (and the step), kept in ``state.log_history``; the
        epoch, once there is one, is added to ``logs`` itself, as transformers does (so
        ``evaluate()``'s metrics hold it), and with ``include_num_input_tokens_seen`` the
        tokens seen (a step's log, from ``started``: the run's time and tokens a second)."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen not in ("no", False):
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if started is not None:
                runtime = time.perf_counter() - started
                logs["train_runtime"] = round(runtime, 4)
                tokens = self.tokens_seen - self.tokens_before
                logs["train_tokens_per_second"] = round(tokens / runtime, 3)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.event("on_log", logs=logs)
        if getattr(self.args, "disable_tqdm", False):
            # transformers then adds PrinterCallback, whose on_log pops total_flos from the
            # logs it is given: train()'s metrics, logged in place, lose it there too
            logs.pop("total_flos", None)

    def batches(self, samples: int) -> int:
        """The eval batches of ``samples`` on each rank, as transformers counts them."""
        per_rank = math.ceil(samples / self.world)
        return math.ceil(per_rank / max(1, self.args.per_device_eval_batch_size))

    def predicted(self, samples: int, metrics: dict[str, float]) -> None:
        """``on_prediction_step`` per batch of ``samples``, then ``on_predict``."""
        for _ in range(self.batches(samples)):
            self.event("on_prediction_step")
        self.event("on_predict", metrics=metrics)

    def evaluated(
        self, loss: float, prefix: str, runtime: float, samples: int, computed: dict | None = None
    ) -> dict:
        """``on_prediction_step`` per eval batch of ``samples``, ``on_log`` and
        ``on_evaluate`` with a held-out loss and the ``computed`` metrics (named already);
        the metrics, named with ``prefix``."""
        batches = self.batches(samples)
        for _ in range(batches):
            self.event("on_prediction_step")
        metrics = {
            f"{prefix}_loss": loss,
            **(computed or {}),
            f"{prefix}_runtime": round(runtime, 4),
            f"{prefix}_samples_per_second": round(samples / runtime, 3),
            f"{prefix}_steps_per_second": round(batches / runtime, 3),
        }
        self.log(metrics)
        self.event("on_evaluate", metrics=metrics)
        return metrics

    def lr_factor(self, total: int) -> Callable[[int], float]:
        """transformers' schedule of ``lr_scheduler_type`` over ``total`` steps."""
        return lr_factor(self.args, total)

    def init_end(self) -> None:
        self.event("on_init_end")

    def train_begin(self, done: int, total: int) -> None:
        args, state = self.args, self.state
        state.global_step, state.max_steps = done, total
        state.epoch = done / self.per_epoch
        self.epoch_index, self.in_epoch = divmod(done, self.per_epoch)
        state.num_train_epochs = math.ceil(total / self.per_epoch)
        state.logging_steps, state.eval_steps = args.logging_steps, args.eval_steps or 0
        state.save_steps = args.save_steps
        state.compute_steps(args, total)  # as transformers: below 1, a share of the steps
        state.train_batch_size = args.per_device_train_batch_size
        self.control.should_training_stop = False
        kept = kept_state(args.output_dir, done) if done else None
        state.log_history = []  # as transformers' new TrainerState (an evaluate() before)
        if kept is not None:  # a resume: transformers restores the checkpoint's state
            state.log_history, self.tokens_seen, best = kept
            for name in BEST:
                setattr(state, name, best[name])
            folder = state.best_model_checkpoint
            if folder is not None and not os.path.isdir(folder):  # as transformers
                state.best_model_checkpoint = None
            state.num_input_tokens_seen = self.tokens_seen
            state.total_flos = self.flops_per_token * self.tokens_seen
        self.tokens_before = self.tokens_seen
        self.started = time.perf_counter()
        self.event("on_train_begin")
        if args.eval_on_start and self.evaluate is not None:  # as transformers, then
            self._evaluate_all()

    def step_end(self, record: dict[str, Any]) -> StepControl:
        state, control = self.state, self.control
        step = record["iteration"] + 1
        if int(record["epoch"]) != self.epoch_index:  # an epoch's steps may have been cut
            self.epoch_index, self.in_epoch = int(record["epoch"]), 0
        if self.in_epoch == 0:
            control.should_epoch_stop = False
            self.event("on_epoch_begin")
        self.in_epoch += 1
        control.should_log = control.should_evaluate = control.should_save = False
        self.event("on_step_begin")
        for _ in range(self.args.gradient_accumulation_steps - 1):
            self.event("on_substep_end")
        self.event("on_pre_optimizer_step")
        self.event("on_optimizer_step")
        state.global_step = step
        state.epoch = self.epoch_index + self._epoch_share()
        self.pending.append(float(record["loss"]))
        if "mean_token_accuracy" in record:
            self.pending_tokens.append((record["mean_token_accuracy"], record["entropy"]))
        self.losses.append(float(record["loss"]))
        self.tokens_seen += int(record["tokens"])
        self.tokens_at[step] = self.tokens_seen
        self.samples += int(record["samples"])
        state.num_input_tokens_seen = self.tokens_seen
        state.total_flos = self.flops_per_token * self.tokens_seen
        self.last = record
        self.event("on_step_end")
        self._log_save_evaluate(record)
        save = bool(control.should_save)
        # as transformers: a flag to stop the epoch or the run ends the epoch here
        cut = bool(control.should_epoch_stop or control.should_training_stop)
        epoch_ends = self.in_epoch == self.per_epoch or step == state.max_steps or cut
        if epoch_ends and save:
            self.epoch_end_after_save = True  # after this step's checkpoint, as transformers
        elif epoch_ends:
            save = self._epoch_end(record)
        if save:
            self.save_asked.add(step)
        end_epoch = bool(control.should_epoch_stop) and self.in_epoch < self.per_epoch
        # under max_steps (or a share of an epoch) transformers runs ceil(max_steps /
        # per_epoch) epochs, cut or not
        counted = self.args.max_steps > 0 or state.max_steps % self.per_epoch
        last = bool(counted) and self.epoch_index + 1 >= state.num_train_epochs
        stop = bool(control.should_training_stop) or (end_epoch and last)
        return StepControl(stop=stop, save=save, end_epoch=end_epoch)

    def _epoch_share(self) -> float:
        """The share of the epoch done after its ``in_epoch`` steps, as transformers counts
        it: its micro-batches done over the epoch's (its last step may hold fewer than
        ``gradient_accumulation_steps``), else the steps done over the epoch's."""
        if not self.epoch_batches:
            return self.in_epoch / self.per_epoch
        done = min(self.in_epoch * self.args.gradient_accumulation_steps, self.epoch_batches)
        return done / self.epoch_batches

    def _epoch_end(self, record: dict[str, Any]) -> bool:
        """``on_epoch_end``, then what its flags ask; whether a checkpoint is asked for."""
        self.control.should_log = self.control.should_evaluate = False
        self.control.should_save = False
        self.event("on_epoch_end")
        self._log_save_evaluate(record)
        return bool(self.control.should_save)

    def _log_save_evaluate(self, record: dict[str, Any]) -> None:
        """The log and the evaluation ``control`` asks for (the save: after the step)."""
        if self.control.should_log and self.pending:
            logs = {
                "loss": sum(self.pending) / len(self.pending),
                "grad_norm": float(record.get("grad_norm", math.nan)),
                "learning_rate": float(record["lr"]),
            }
            if self.token_metrics:
                logs["num_tokens"] = float(self.tokens_seen)
            if self.pending_tokens:  # each step's (exact over its tokens), averaged as TRL
                logs["mean_token_accuracy"] = _mean(a for a, _ in self.pending_tokens)
                logs["entropy"] = _mean(e for _, e in self.pending_tokens)
            self.pending.clear()
            self.pending_tokens.clear()
            self.log(logs, self.started)
        if self.control.should_evaluate and self.evaluate is not None:
            self._keep_best(self._evaluate_all())

    def _evaluate_all(self) -> dict[str, float]:
        """Each eval set's loss under the model as it is now, logged (collective); the
        metrics of all."""
        metrics: dict[str, float] = {}
        for prefix, loss, runtime in self.evaluate():
            metrics.update(self.evaluated(loss, prefix, runtime, self.eval_samples[prefix]))
        return metrics

    def _keep_best(self, metrics: dict[str, float]) -> None:
        """``state.best_metric`` (and, when checkpoints are saved by steps or epochs,
        ``best_global_step``) from an evaluation's ``metrics``, when its
        ``metric_for_best_model`` beats the best so far (greater or lower, as
        ``greater_is_better`` says; checked before training, unless no evaluation was
        planned: then refused here, as transformers raises)."""
        key, state = best_metric_key(self.args), self.state
        if key is None:
            return
        if key not in metrics:  # an evaluation a callback asked for (eval_strategy no)
            raise unknown_best_metric(self.args, [k for k in metrics if k.endswith("_loss")])
        value, best = metrics[key], state.best_metric
        better = self.args.greater_is_better
        if best is None or (value > best if better else value < best):
            state.best_metric = value
            if getattr(self.args.save_strategy, "value", self.args.save_strategy) != "no":
                state.best_global_step = state.global_step

    def _best_checkpoint(self) -> None:
        """``state.best_model_checkpoint``: ``output_dir/checkpoint-N`` of the best step,
        once the run holds its checkpoint (every rank, after a save)."""
        step = self.state.best_global_step
        if step and checkpoint_of(self.args.output_dir, step) is not None:
            self.state.best_model_checkpoint = os.path.join(
                self.args.output_dir, f"checkpoint-{step}"
            )

    def saved(self, step: int, folder: Path) -> None:
        self._best_checkpoint()
        if self.state.is_world_process_zero:
            link_checkpoint(self.args.output_dir, folder)
            tokens = self.tokens_at.get(step, self.tokens_seen)
            best = {name: getattr(self.state, name) for name in BEST}
            keep_state(self.args.output_dir, step, tokens, self.state.log_history, best)
        if step in self.save_asked:
            self.event("on_save")
        if self.epoch_end_after_save:
            self.epoch_end_after_save = False
            if self._epoch_end(self.last):
                self.event("on_save")  # the step's checkpoint is the epoch's too

    def train_end(self, done: int) -> None:
        runtime = time.perf_counter() - self.started
        loss = sum(self.losses) / max(1, len(self.losses))
        self.metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(self.samples / runtime, 3),
            "train_steps_per_second": round(len(self.losses) / runtime, 3),
            "total_flos": float(self.state.total_flos),
            "train_loss": loss,
        }
        self.log(self.metrics)  # in place, as transformers: train() returns what it logs
        self.event("on_train_end")


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
