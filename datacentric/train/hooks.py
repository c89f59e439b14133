"""What a caller of the trainer runs at its events: the start, the end of each step
(with the step's record), each completed checkpoint and the end of the run.

The trainer calls the same hooks on every rank with the same values (a step's record
holds the global loss), so a hook that decides from them asks every rank to stop or
save at the same step. :class:`StepHooks` does nothing; the integrations
(:mod:`datacentric.integrations`) turn these events into transformers' callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class StepControl:
    """What a hook asks of the trainer after a step."""

    stop: bool = False
    """Stop after this step (a final checkpoint is saved, as at the planned end)."""
    save: bool = False
    """Save a checkpoint of this step now."""
    end_epoch: bool = False
    """Skip the rest of this step's epoch: the next step is the next epoch's first."""


class StepHooks:
    """No-op hooks of :class:`~datacentric.train.trainer.Trainer`; override any."""

    def lr_factor(self, total: int) -> Callable[[int], float] | None:
        """The multiplier of the peak learning rate at optimizer step n (0-based) of a run
        of ``total`` steps, in place of the ``[training]`` section's schedule (None: the
        section's)."""
        return None

    def train_begin(self, done: int, total: int) -> None:
        """Before the first step: ``done`` steps were run already (a resume), ``total``
        are planned."""

    def step_end(self, record: dict[str, Any]) -> StepControl:
        """After step ``record["iteration"] + 1`` (its metrics record: loss, lr,
        grad_norm, epoch, and val_loss when validation ran)."""
        return StepControl()

    def saved(self, step: int, folder: Path) -> None:
        """A checkpoint of step ``step`` is complete in ``folder``."""

    def train_end(self, done: int) -> None:
        """After the last step (``done`` steps in all) and its checkpoint."""
