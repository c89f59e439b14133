"""The run's learning-rate schedule: warm-up, then constant, linear or cosine decay over
the planned steps (the ``[training]`` section), replayed from the step count on resume.

:func:`planned_total` is the step count the schedule spans (``iterations``, else
``epochs`` epochs); :func:`lr_scheduler` builds the ``LambdaLR`` the loop steps once per
optimizer step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from datacentric.settings.sections import TrainingConfig
from datacentric.train.reporting.metric_sinks import logger


def lr_lambda(training: TrainingConfig, total: int):
    """Multiplier of the peak learning rate at optimizer step ``n`` (0-based), from the
    ``[training]`` section's warm-up and schedule over ``total`` steps."""
    warmup = training.warmup_iterations

    def factor(n: int) -> float:
        if warmup and n < warmup:
            return (n + 1) / warmup
        if training.lr_schedule == "constant":
            return 1.0
        span = max(1, total - warmup)
        if training.lr_schedule == "linear":  # transformers' linear decay to 0
            return max(0.0, (total - n) / span)
        progress = min(1.0, (n - warmup) / span)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def planned_total(training: TrainingConfig, per_epoch: int, *, note: bool = False) -> int:
    """The steps the ``[training]`` section plans at ``per_epoch`` steps an epoch
    (``iterations``, else ``epochs`` epochs); ``note``: say when ``iterations`` overrides
    ``epochs``."""
    if training.iterations is None:
        return training.epochs * per_epoch
    if note and training.iterations != training.epochs * per_epoch:
        # iterations is a max_steps: it wins over epochs; say so (the data repeats
        # or stops early, unlike what `epochs` alone would do)
        log = logger.warning if training.iterations > per_epoch * training.epochs else logger.info
        log(
            "datacentric train: note: training.iterations %d sets the step count over "
            "training.epochs %d (%d steps per epoch): %.3g epochs of data",
            training.iterations,
            training.epochs,
            per_epoch,
            training.iterations / max(1, per_epoch),
        )
    return training.iterations


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    training: TrainingConfig,
    total: int,
    done: int,
    factor: Callable[[int], float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``[training]`` section's learning-rate schedule over ``total`` steps (or
    ``factor``'s), at step ``done`` when the run continues."""
    for group in optimizer.param_groups:
        # The schedule multiplies the configured peak; a loaded optimizer state holds
        # the decayed rate of its last step, which must not become the new base.
        group["initial_lr"] = training.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor or lr_lambda(training, total))
    if done:
        # LambdaLR is a pure function of the step count: replay it, no state needed.
        scheduler.last_epoch = done - 1
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
            scheduler.step()
    return scheduler
