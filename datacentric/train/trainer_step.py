"""One optimizer step of the trainer (:class:`~datacentric.train.trainer.Trainer`): the
step's micro-batches forward and backward under mixed precision (fault injection after the
first), a loss that is not finite refused (:class:`NonFiniteLossError`), the gradient
clipped, a gradient that is not finite refused too (:func:`check_finite_gradient`), the
optimizer and the learning-rate schedule stepped once, the step's samples and its metrics
record. :class:`TrainerStep` is a base of the trainer: its methods read what
``Trainer.__init__`` sets.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import torch

from datacentric.parallel.step import forward_autocast
from datacentric.regular_files import open_regular
from datacentric.train.data_centric import Step
from datacentric.train.reporting.heartbeat import is_timeout
from datacentric.train.reporting.metrics import step_record


class NonFiniteLossError(RuntimeError):
    """The loss of an optimizer step, or its gradient, is NaN or infinite; the step was
    not applied."""


def check_finite_gradient(step: Step, loss: float, grad_norm: torch.Tensor) -> torch.Tensor:
    """Refuse ``step`` before the optimizer applies it when its gradient's norm (the same
    on every rank: the whole gradient's) is not finite though its loss is: clipping would
    scale every gradient by NaN and the step would turn every weight NaN. Returns the
    norm as a plain tensor (an FSDP2 norm gathered once), which the step's record reads."""
    whole = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    norm = float(whole)
    if not math.isfinite(norm):
        raise NonFiniteLossError(
            f"iteration {step.number} (epoch {step.epoch}): the gradient's norm is {norm} "
            f"though the loss is {loss:.6g}; samples {sorted(step.sample_ids)}. The step was "
            "not applied and the last checkpoint is intact; lower the learning rate, train "
            "in float32 or inspect these samples and the model's backward pass"
        )
    return whole


class TrainerStep:
    """How the trainer runs one step (a base of :class:`~datacentric.train.trainer.Trainer`)."""

    def _autocast(self) -> torch.autocast:
        """Mixed precision of the forward passes (``[model] dtype``)."""
        return forward_autocast(self.groups.device, "bfloat16" if self.bfloat16 else "float32")

    def _maybe_inject_fault(self, number: int) -> None:
        """Kill (or hang) this rank after its first micro-batch of the step named by the
        fault-injection setting, once per run folder (a marker file records it)."""
        if self.fault is not None:
            self.fault.after_first_micro_batch(number)

    def _step(self, step: Step, scheduler) -> dict[str, Any]:
        """Run one step of ``DataCentric.steps()``: the user loop's body plus mixed
        precision, fault injection, clipping and the step's metrics record."""
        self.optimizer.zero_grad(set_to_none=True)
        self.step_metrics.start()
        started = time.perf_counter()
        autocast = self._autocast()
        self._step_now = step
        loss = self._forward_backward(step, autocast)
        sample_ids = step.sample_ids
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"iteration {step.number} (epoch {step.epoch}): loss "
                f"is {loss}; samples {sorted(sample_ids)}. The step was not applied and the "
                "last checkpoint is intact; lower the learning rate or inspect these samples"
            )
        # The norm before clipping, over the whole gradient (every shard under FSDP2).
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.training.grad_clip or math.inf
        )
        grad_norm = check_finite_gradient(step, loss, grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        scheduler.step()
        elapsed = time.perf_counter() - started
        if self.is_main:
            with open_regular(self.out / "samples.jsonl", "a") as handle:
                handle.write(
                    json.dumps(
                        {"iteration": step.number, "epoch": step.epoch, "sample_ids": sample_ids}
                    )
                    + "\n"
                )
        return step_record(
            step,
            loss,
            lr,
            grad_norm,
            elapsed,
            metrics=self.step_metrics,
            optimizer=self.optimizer,
            shapes=self.shapes,
            loss_tokens=self.loss_tokens,
            timeline=self.metrics_config.timeline,
        )

    def _forward_backward(self, step: Step, autocast: torch.autocast) -> float:
        """Every micro-step of ``step`` (fault injection after the first), then its one
        gradient reduction; the global loss. A failure or a timeout names the rank, the
        step, its phase and (timed out) what the peers were doing."""
        try:
            for k, micro in enumerate(step):
                with autocast:
                    loss_S = self.model(micro.batch)
                micro.backward(loss_S)
                if k == 0:
                    self._maybe_inject_fault(step.number)
            return step.finish()
        except RuntimeError as err:
            timed_out = is_timeout(err)
            peers = (
                (self.heartbeat.describe_peers() or "a peer rank stopped answering?")
                if timed_out
                else ""
            )
            raise RuntimeError(
                f"rank {self.groups.rank}: iteration {step.number} "
                f"{'timed out' if timed_out else 'failed'} in {step.phase}"
                f"{f' ({peers})' if timed_out else ''}: {err}"
            ) from err
