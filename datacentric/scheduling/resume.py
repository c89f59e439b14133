"""Resuming a schedule at an iteration boundary, and replanning what is left.

A schedule is a pure function of (shapes, policy, world, cost model, plan, seed,
epoch, options), so the state needed to resume is tiny: those names and numbers, the
next iteration, and a fingerprint of the schedule that proves the rebuilt one is the
same (a changed dataset, cost model or option is a clear error, not a silent skip).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Schedule
from datacentric.scheduling.epoch import build_schedule
from datacentric.scheduling.options import ScheduleOptions
from datacentric.shapes import SampleShape


def schedule_fingerprint(schedule: Schedule) -> str:
    """A hash of who runs which samples where: policy, world, seed, epoch and every
    group's ranks and sample ids in order (estimates and meta excluded)."""
    digest = hashlib.sha256()
    head = (schedule.policy, schedule.world_size, schedule.seed, schedule.epoch)
    digest.update(repr((*head, schedule.num_samples)).encode())
    for it in schedule.iterations:
        for a in it.assignments:
            digest.update(np.asarray([-1, it.index, a.rank_start, a.sp_size], np.int64).tobytes())
            for mb in a.micro_batches:
                digest.update(np.asarray((-2, *mb.sample_ids), dtype=np.int64).tobytes())
    digest.update(np.asarray(schedule.dropped_sample_ids, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class ScheduleState:
    """Where an epoch stands: enough to rebuild its schedule and continue."""

    policy: str
    world_size: int
    seed: int
    epoch: int
    num_samples: int
    next_iteration: int
    """The first iteration not yet run (0 at the start of the epoch)."""
    fingerprint: str

    @classmethod
    def at(cls, schedule: Schedule, next_iteration: int) -> ScheduleState:
        """The state of ``schedule`` once iterations ``0..next_iteration-1`` have run."""
        if not 0 <= next_iteration <= len(schedule.iterations):
            raise ValueError(
                f"next_iteration {next_iteration} is outside 0..{len(schedule.iterations)}"
            )
        return cls(
            policy=schedule.policy,
            world_size=schedule.world_size,
            seed=schedule.seed,
            epoch=schedule.epoch,
            num_samples=schedule.num_samples,
            next_iteration=int(next_iteration),
            fingerprint=schedule_fingerprint(schedule),
        )

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> ScheduleState:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def resume_schedule(
    shapes: Sequence[SampleShape],
    state: ScheduleState,
    *,
    cost_model: CostModel,
    plan: Plan | None = None,
    options: ScheduleOptions | None = None,
) -> tuple[Schedule, int]:
    """Rebuild the schedule ``state`` was taken from; returns it and the iteration to
    continue at. Raises ``ValueError`` if the rebuilt schedule differs."""
    if len(shapes) != state.num_samples:
        raise ValueError(
            f"the saved schedule covers {state.num_samples} samples but the dataset has "
            f"{len(shapes)}: it changed since the state was saved"
        )
    schedule = build_schedule(
        shapes,
        policy=state.policy,
        world_size=state.world_size,
        cost_model=cost_model,
        plan=plan,
        seed=state.seed,
        epoch=state.epoch,
        options=options,
        measure=False,
    )
    if schedule_fingerprint(schedule) != state.fingerprint:
        raise ValueError(
            f"the rebuilt {state.policy} schedule (seed {state.seed}, epoch {state.epoch}, "
            f"world {state.world_size}) differs from the saved one: the dataset, cost model, "
            "plan or options changed; use replan_remaining with the old inputs, or restart "
            "the epoch"
        )
    return schedule, state.next_iteration


def replan_remaining(
    shapes: Sequence[SampleShape],
    state: ScheduleState,
    *,
    world_size: int,
    cost_model: CostModel,
    plan: Plan | None = None,
    options: ScheduleOptions | None = None,
    policy: str | None = None,
    new_plan: Plan | None = None,
    new_cost_model: CostModel | None = None,
) -> Schedule:
    """A schedule of the samples the epoch has not run yet, for ``world_size`` ranks.

    ``cost_model``/``plan``/``options`` must be those of the saved run (they rebuild
    it and tell which samples already ran); ``new_plan``/``new_cost_model`` describe
    the new world if they differ. Samples already run are listed in the new
    schedule's ``dropped_sample_ids`` and counted in ``meta['samples_excluded']``,
    apart from the ones really dropped (``meta['samples_dropped']``).
    """
    old, start = resume_schedule(shapes, state, cost_model=cost_model, plan=plan, options=options)
    done = [i for it in old.iterations[:start] for i in it.sample_ids()]
    left = np.setdiff1d(np.arange(old.num_samples), np.asarray(done + list(old.dropped_sample_ids)))
    if len(left) == 0:
        raise ValueError("nothing left to replan: the epoch has run every sample")
    schedule = build_schedule(
        shapes,
        policy=policy or state.policy,
        world_size=world_size,
        cost_model=new_cost_model or cost_model,
        plan=new_plan or plan,
        seed=state.seed,
        epoch=state.epoch,
        options=options,
        sample_ids=left,
    )
    schedule.meta["replanned_from"] = {
        "world_size": state.world_size,
        "next_iteration": start,
        "samples_already_run": len(done),
    }
    return schedule
