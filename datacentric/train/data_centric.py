"""The public API: a few changed lines turn a plain PyTorch loop into a DCP loop.

.. code-block:: python

    dc = DataCentric(model, dataset, preset="llama", policy="dcp-opt")
    for step in dc.steps():
        for micro in step:                        # this rank's micro-batches
            micro.backward(model(micro.batch))    # per-token loss, weighted exactly
        loss = step.finish()                      # one gradient all-reduce per step
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

``DataCentric`` owns the process groups (from torchrun's environment, or one
process), injects sequence-parallel attention and per-block recomputation into
the model, plans every bucket of the dataset's shapes and schedules each epoch
with the chosen policy. Every rank computes the same schedule, with no
communication. The gradient after ``step.finish()`` is the global batch's mean
gradient, whatever the groups, accumulation counts and recomputation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from torch import nn

from datacentric.data.base import epoch_pack
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import init_from_env
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime, IterationStats, MicroStep
from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.planning.planner import plan_buckets
from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling.epoch import build_schedule
from datacentric.scheduling.options import ScheduleOptions
from datacentric.shapes import SampleShape, make_buckets
from datacentric.train.build import build_cost_model


def default_groups() -> ProcessGroups:
    """The world from torchrun's environment when present, else one local process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return ProcessGroups()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return init_from_env()
    return ProcessGroups.local()


class Step:
    """One optimizer step: iterate it for this rank's micro-batches, then ``finish()``."""

    def __init__(self, runtime: DataCentricRuntime, iteration: Iteration) -> None:
        self.runtime = runtime
        self.iteration = iteration
        self.stats: IterationStats = runtime.start_iteration(iteration)

    def __iter__(self) -> Iterator[MicroStep]:
        return self.runtime.micro_steps(self.iteration, self.stats)

    def finish(self) -> float:
        """Sum gradients over the world once (collective) and return the global loss."""
        self.runtime.finish_iteration(self.stats)
        return self.runtime.global_loss(self.stats)

    @property
    def sample_ids(self) -> list[int]:
        """Every sample of this step, over all ranks."""
        return self.iteration.sample_ids()


class EpochPlanner:
    """Plans a dataset's buckets once and builds each epoch's schedule (pure: no
    communication, the same result on every rank and in a separate process)."""

    def __init__(
        self,
        shapes: Sequence[SampleShape],
        cost_model: CostModel,
        *,
        world_size: int,
        policy: str = "dcp-opt",
        memory_gb: float | None = None,
        tokens_per_iteration: int | None = None,
        seed: int = 0,
    ) -> None:
        self.shapes = list(shapes)
        self.cost_model = cost_model
        self.world_size = world_size
        self.policy = policy
        self.seed = seed
        cap = int(memory_gb * 2**30) if memory_gb else None
        self.options = ScheduleOptions(
            memory_cap_bytes=cap, tokens_per_iteration=tokens_per_iteration
        )
        self.plan: Plan = plan_buckets(
            make_buckets(self.shapes), cost_model, world_size=world_size, memory_cap_bytes=cap
        )

    def schedule(self, epoch: int = 0, sample_ids: Sequence[int] | None = None) -> Schedule:
        """The epoch's schedule; ``sample_ids`` restricts it to those samples."""
        return build_schedule(
            self.shapes,
            policy=self.policy,
            world_size=self.world_size,
            cost_model=self.cost_model,
            plan=self.plan,
            seed=self.seed,
            epoch=epoch,
            options=self.options,
            sample_ids=sample_ids,
        )


class DataCentric:
    """Data-centric parallel training of ``model`` on ``dataset``.

    ``model`` follows the model contract (``blocks``, ``set_attention``,
    ``num_heads``, ``loss_mode``, ``forward(batch) -> per-token loss``);
    ``dataset`` has ``shapes()``, ``pack(ids, pad_to_multiple, *, epoch)`` and
    ideally ``loss_tokens(id)`` (docs/data.md). The cost model is ``cost_model`` if given, else the
    analytic model of ``preset`` on this device. ``memory_gb`` caps each rank's
    planned memory; ``tokens_per_iteration`` bounds the global batch.
    """

    def __init__(
        self,
        model: nn.Module,
        dataset,
        *,
        policy: str = "dcp-opt",
        preset: str | None = None,
        cost_model: CostModel | None = None,
        memory_gb: float | None = None,
        tokens_per_iteration: int | None = None,
        seed: int = 0,
        dtype: str = "float32",
        groups: ProcessGroups | None = None,
    ) -> None:
        self.groups = groups or default_groups()
        self.model = model.to(self.groups.device)
        self.dataset = dataset
        if cost_model is None:
            if preset is None:
                raise ValueError("DataCentric needs a cost_model, or the preset name of the model")
            cost_model = build_cost_model(preset, self.groups.device, dtype)
        self.planner = EpochPlanner(
            dataset.shapes(),
            cost_model,
            world_size=self.groups.world_size,
            policy=policy,
            memory_gb=memory_gb,
            tokens_per_iteration=tokens_per_iteration,
            seed=seed,
        )
        self.runtime = DataCentricRuntime(
            self.model, self.groups, dataset.pack, loss_tokens_function(dataset)
        )

    @property
    def rank(self) -> int:
        return self.groups.rank

    def schedule(self, epoch: int = 0, sample_ids: Sequence[int] | None = None) -> Schedule:
        """The epoch's schedule (the same on every rank); ``sample_ids`` restricts it."""
        return self.planner.schedule(epoch, sample_ids)

    def set_epoch(self, epoch: int) -> None:
        """Pack the coming steps' micro-batches for ``epoch`` (per-epoch noise, crops)."""
        self.runtime.pack = epoch_pack(self.dataset, epoch)

    def step(self, iteration: Iteration) -> Step:
        """A :class:`Step` for one iteration of a schedule."""
        return Step(self.runtime, iteration)

    def steps(self, epochs: int = 1, start_epoch: int = 0) -> Iterator[Step]:
        """Every optimizer step of ``epochs`` epochs, in order."""
        for epoch in range(start_epoch, start_epoch + epochs):
            self.set_epoch(epoch)
            for iteration in self.schedule(epoch).iterations:
                yield self.step(iteration)
