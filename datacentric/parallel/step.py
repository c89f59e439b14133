"""One optimizer step of a schedule on this rank: the one driver.

:class:`Step` runs an iteration's micro-batches through the runtime
(:meth:`~datacentric.parallel.runtime.DataCentricRuntime.micro_steps`), then one
gradient reduction and one gather of every rank's loss and timings. ``DataCentric.steps()``
and the trainer yield it; the profiler and the equivalence harness run it with
:func:`run_step` (the model's own forward on each micro-batch), so training, measuring
and checking execute schedules through one path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from datacentric.parallel.annotate import annotate
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.runtime import DataCentricRuntime, IterationStats, MicroStep
from datacentric.schedule import Iteration


def gather_floats(values: list[float], groups: ProcessGroups) -> torch.Tensor:
    """``(world, len(values))`` float64 table of every rank's values (one collective)."""
    mine = torch.tensor(values, dtype=torch.float64, device=groups.device)
    if not groups.distributed or groups.world_size == 1:
        return mine.unsqueeze(0).cpu()
    table = [torch.empty_like(mine) for _ in range(groups.world_size)]
    dist.all_gather(table, mine, group=groups.world)
    return torch.stack(table).cpu()


class Step:
    """One optimizer step: iterate it for this rank's micro-batches, then ``finish()``.

    After ``finish()``: :attr:`loss` (the global batch's), every rank's compute and
    runtime seconds (:attr:`rank_compute_s`, :attr:`rank_time_s`) and this rank's
    seconds waiting for packed data (:attr:`data_wait_s`). :attr:`phase`
    names what the step is doing (for error messages of hung or failed collectives).
    """

    def __init__(
        self,
        runtime: DataCentricRuntime,
        iteration: Iteration,
        *,
        number: int | None = None,
        epoch: int | None = None,
        on_finish: Callable[[Step], Any] | None = None,
    ) -> None:
        self.runtime = runtime
        self.iteration = iteration
        self.number = number
        """Optimizer steps the run had done before this one (steps of ``steps()``)."""
        self.epoch = epoch
        """The epoch this step belongs to (steps of ``steps()``)."""
        self.phase = "setup"
        self.loss: float | None = None
        self.rank_compute_s: list[float] = []
        self.rank_time_s: list[float] = []
        self.data_wait_s = 0.0
        self.token_accuracy: float | None = None
        """The share of the step's loss tokens (every rank's) whose target is the model's
        argmax (``runtime.token_metrics``; None: not counted)."""
        self.entropy: float | None = None
        """The mean entropy of the predicted distribution over the same tokens."""
        self.schedule_wait_s = 0.0
        """Seconds the run waited for scheduling before this step (``steps()``: the
        first step's schedule is built then; later epochs' are built ahead)."""
        self._on_finish = on_finish
        self.stats: IterationStats = runtime.start_iteration(iteration)

    def __iter__(self) -> Iterator[MicroStep]:
        mine = self.iteration.micro_batches_of_rank(self.runtime.groups.rank)
        for k, micro in enumerate(self.runtime.micro_steps(self.iteration, self.stats)):
            self.phase = f"micro-batch {k} (forward/backward with {self._collectives(mine, k)})"
            yield micro

    def _collectives(self, mine: Sequence[Any], k: int) -> str:
        """The collectives micro-batch ``k`` of this rank issues, by who issues them."""
        group, last = mine[k][0], k == len(mine) - 1
        sp = f"the SP all-to-all of the group of {group.sp_size} at rank {group.rank_start}"
        runtime = self.runtime
        if runtime.fsdp2:
            parts = ["FSDP's parameter all-gather", sp]
            in_backward = last and runtime.syncs_in_backward
            return ", ".join(parts + (["FSDP's gradient reduce-scatter"] if in_backward else []))
        if runtime.syncs_in_backward and last:
            return f"{sp} and DDP's gradient all-reduce"
        return sp

    def finish(self) -> float:
        """Sum gradients over the world once, gather every rank's loss share and
        timings (collectives) and return the global batch's loss."""
        runtime = self.runtime
        self.phase = (
            "the end of the step (waiting for "
            f"{'FSDP' if runtime.fsdp2 else 'DDP'}'s gradient sync)"
            if runtime.syncs_in_backward
            else (
                "the FSDP2 reduce-scatter of every unit"
                if runtime.fsdp2
                else "the gradient all-reduce over the world"
            )
        )
        self.runtime.finish_iteration(self.stats)
        self.phase = "the all-gather of losses and timings"
        compute_s = sum(mb.time_s for mb in self.stats.micro_batches)
        sums = self.stats.token_sums
        with annotate("gather losses and timings"):
            table = gather_floats(
                [self.stats.weighted_loss, compute_s, self.stats.total_time_s]
                + (sums.tolist() if sums is not None else []),
                self.runtime.groups,
            )
        self.loss = float(table[:, 0].sum())
        if sums is not None:  # sums over every rank's tokens, divided once
            tokens, correct, entropy = (float(x) for x in table[:, 3:].sum(0))
            self.token_accuracy = correct / tokens if tokens else 0.0
            self.entropy = entropy / tokens if tokens else 0.0
        self.rank_compute_s = [float(x) for x in table[:, 1]]
        self.rank_time_s = [float(x) for x in table[:, 2]]
        take_wait = getattr(self.runtime.pack, "take_wait_s", None)  # a Prefetcher
        self.data_wait_s = float(take_wait()) if take_wait is not None else 0.0
        self.phase = "finished"
        if self._on_finish is not None:
            self._on_finish(self)
        return self.loss

    @property
    def finished(self) -> bool:
        """``finish()`` has run."""
        return self.loss is not None

    @property
    def runtime_time_s(self) -> float:
        """The runtime's time of the step: the slowest rank's (after ``finish()``)."""
        return max(self.rank_time_s, default=0.0)

    @property
    def sample_ids(self) -> list[int]:
        """Every sample of this step, over all ranks."""
        return self.iteration.sample_ids()


def forward_autocast(device: torch.device, dtype: str) -> torch.autocast:
    """The mixed precision of a run's forward passes (``[model] dtype``): ``bfloat16``
    autocasts on ``device`` (weights, gradients and optimizer state stay float32);
    ``float32`` is disabled autocast. The trainer and the profiler run passes under it."""
    return torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"
    )


def run_step(runtime: DataCentricRuntime, iteration: Iteration, *, dtype: str = "float32") -> Step:
    """Run one iteration as a finished :class:`Step`: ``micro.backward(model(batch))``
    for each of this rank's micro-batches, each forward under :func:`forward_autocast`
    of ``dtype`` (the dtype the run trains in, as the trainer runs it), then ``finish()``
    (collective: every rank of the world calls it with the same iteration)."""
    step = Step(runtime, iteration)
    autocast = forward_autocast(runtime.groups.device, dtype)
    for micro in step:
        with autocast:
            loss_S = runtime.model(micro.batch)
        micro.backward(loss_S)
    step.finish()
    return step
