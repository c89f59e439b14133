"""The scheduler's entry point: ``build_schedule`` and the policy registry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Schedule
from datacentric.scheduling import (
    dcp_inter,
    dcp_intra,
    dcp_opt,
    dcp_pac,
    megatron_dyncp,
    packed,
    static,
    static_reference,
)
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.measures import (
    old_gpu_seconds,
    sample_gpu_seconds,
    schedule_measures,
    step_bound_s,
)
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import SampleShape

#: Every policy by name: a pure function of its :class:`PolicyInput`.
POLICIES: dict[str, Callable[[PolicyInput], PolicyOutput]] = {
    "static": static.schedule,
    "static-reference": static_reference.schedule,
    "packed": packed.schedule,
    "dcp-intra": dcp_intra.schedule,
    "dcp-inter": dcp_inter.schedule,
    "dcp-pac": dcp_pac.schedule,
    "megatron-dyncp": megatron_dyncp.schedule,
    "dcp-opt": dcp_opt.schedule,
}


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator every rank derives for ``(seed, epoch)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)]))


def build_schedule(
    shapes: Sequence[SampleShape],
    *,
    policy: str,
    world_size: int,
    cost_model: CostModel,
    plan: Plan,
    seed: int = 0,
    epoch: int = 0,
    options: SchedulingConfig | None = None,
    sample_ids: Sequence[int] | None = None,
    measure: bool = True,
    on_step: Callable[[int, int], None] | None = None,
) -> Schedule:
    """An epoch of iterations for the dataset ``shapes`` (sample id = index).

    A pure function of its arguments: every rank computes the same schedule, with
    no communication. ``plan`` is the one authority on what each bucket may run with
    (its options) and on the memory budget, which the schedule carries
    (``Schedule.memory_cap_bytes``); its skipped buckets' samples are dropped
    (reported). :class:`~datacentric.scheduling.pipeline.Pipeline` makes the plan and
    calls this.
    ``sample_ids`` restricts the epoch to those samples (the rest are listed as
    dropped; :func:`~datacentric.scheduling.resume.continue_schedule` uses it).
    ``measure`` fills ``meta`` with imbalance, efficiency, the ideal bound and the
    per-step bounds (``efficiency_step_bound``). ``meta["settings"]`` holds what the
    policy chose (e.g. ``static``'s SP size, recomputation and token budget).
    ``on_step(done, total)`` is told the steps scheduled so far out of the epoch's (a
    progress line); it changes nothing in the schedule.
    """
    _check_call(policy, world_size, plan)
    options = options or SchedulingConfig()
    started = time.perf_counter()
    view = DatasetView(shapes)
    asked, not_asked, skipped = _samples_to_schedule(view, plan, sample_ids)
    if not asked.any():
        raise ValueError("no samples to schedule (all were skipped or excluded)")
    inp = PolicyInput(
        view=view,
        cost_model=cost_model,
        world_size=int(world_size),
        options=options,
        plan=plan,
        rng=epoch_rng(seed, epoch),
        active=np.flatnonzero(asked),
        seed=int(seed),
        epoch=int(epoch),
        on_step=on_step,
    )
    out = inp.run_policy(policy, POLICIES[policy])
    inp.step_done(len(out.iterations), len(out.iterations))
    dropped = np.concatenate([skipped, np.asarray(out.dropped, dtype=np.int64)])
    schedule = _schedule_of(inp, policy, out, not_asked, skipped, dropped)
    schedule.meta["plan_seconds"] = time.perf_counter() - started
    if measure:
        kept = asked.copy()
        kept[dropped] = False
        schedule.meta.update(_measures(schedule, inp, np.flatnonzero(kept)))
    return schedule


def _check_call(policy: str, world_size: int, plan: Plan) -> None:
    """Raise on a policy name, world size or plan :func:`build_schedule` cannot use."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not isinstance(plan, Plan):
        raise TypeError("build_schedule needs the plan (Pipeline(...).plan, or plan_buckets)")


def _schedule_of(
    inp: PolicyInput,
    policy: str,
    out: PolicyOutput,
    not_asked: np.ndarray,
    skipped: np.ndarray,
    dropped: np.ndarray,
) -> Schedule:
    """The :class:`Schedule` of the policy's ``out``, its ``meta`` telling the samples
    excluded (``not_asked``), skipped by the plan and dropped (``dropped``, the skipped
    ones included), the budget, the options and the policy's settings."""
    view, options = inp.view, inp.options
    meta: dict = {
        "samples_total": view.num_samples,
        "samples_excluded": int(len(not_asked)),
        "samples_dropped": int(len(dropped)),
        "samples_skipped_by_plan": int(len(skipped)),
        "memory_cap_bytes": inp.memory_cap_bytes,
        # the options the policy ran with (which policy ran is the schedule's ``policy``)
        "options": {k: v for k, v in asdict(options).items() if k != "policy"},
        "settings": dict(out.settings),
    }
    return Schedule(
        world_size=inp.world_size,
        policy=policy,
        seed=inp.seed,
        epoch=inp.epoch,
        num_samples=view.num_samples,
        iterations=tuple(out.iterations),
        dropped_sample_ids=tuple(sorted(int(i) for i in np.concatenate([not_asked, dropped]))),
        meta=meta,
        memory_cap_bytes=inp.memory_cap_bytes,
    )


def _samples_to_schedule(
    view: DatasetView, plan: Plan, sample_ids: Sequence[int] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(asked, not_asked, skipped)``: the mask of the samples this epoch schedules, the
    ids left out by ``sample_ids`` and the ids of the buckets the plan skipped."""
    asked = np.ones(view.num_samples, dtype=bool)
    if sample_ids is not None:
        ids = np.asarray(sample_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= view.num_samples):
            raise ValueError(f"sample_ids must lie in 0..{view.num_samples - 1}")
        asked[:] = False
        asked[ids] = True
    not_asked = np.flatnonzero(~asked)
    skipped = np.zeros(0, dtype=np.int64)
    if plan.skipped:
        gone = [view.bucket_index[name] for name in plan.skipped if name in view.bucket_index]
        in_gone = np.isin(view.bucket_of, gone)
        skipped = np.flatnonzero(asked & in_gone)
        asked &= ~in_gone
    return asked, not_asked, skipped


def _measures(schedule: Schedule, inp: PolicyInput, scheduled: np.ndarray) -> dict:
    """Imbalance, efficiency, the ideal bound and the per-step bounds of ``schedule``
    (``scheduled``: the ids it runs), each sample priced at its own length."""
    view, world_size = inp.view, inp.world_size
    table = inp.pac_table()
    work = np.zeros(view.num_samples)
    work[scheduled] = sample_gpu_seconds(table, scheduled)
    ideal = float(work.sum()) / world_size if len(scheduled) else None
    bounds = []
    for it in schedule.iterations:
        ids = np.asarray(it.sample_ids(), dtype=np.int64)
        bounds.append(step_bound_s(table, ids, world_size, work[ids]))
    out = schedule_measures(
        schedule, inp.cost_model, ideal, shapes=view.shapes, step_bounds_s=bounds
    )
    old = float(old_gpu_seconds(table, scheduled).sum()) / world_size if ideal else None
    epoch = out["est_epoch_time_s"]
    out["ideal_epoch_time_old_s"] = old
    out["efficiency_old_bound"] = old / epoch if old and epoch else None
    return out
