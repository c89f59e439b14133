"""Run several scheduling policies on one workload and compare their simulated results.

The schedules come from :func:`datacentric.scheduling.build_schedule` (the very
objects the runtime executes), the epoch-time bound from the scheduler's own
:func:`~datacentric.scheduling.ideal_epoch_time`, and every policy is executed by
:func:`datacentric.sim.engine.simulate` on the same cost model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.planning.planner import plan_buckets
from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.factory import MEMORY_FRACTION, analytic_cost_model
from datacentric.schedule import Schedule
from datacentric.shapes import SampleShape, make_buckets
from datacentric.sim.engine import SimResult, simulate

if TYPE_CHECKING:
    from datacentric.scheduling import ScheduleOptions

#: The policies of the paper reproduction, baseline first.
DEFAULT_POLICIES = (
    "static",
    "static-reference",
    "megatron-dyncp",
    "dcp-intra",
    "dcp-inter",
    "dcp-pac",
    "dcp-opt",
)


def simulation_cost_model(
    model: str,
    hardware: str,
    world_size: int,
    *,
    memory_gb: float | None = None,
    shard: ShardingSpec | str | None = None,
) -> AnalyticCostModel:
    """The analytic cost model the simulator uses for ``model`` on ``hardware``.

    Settings (stated, not fitted): bf16; plans capped at 70% of device memory (or
    ``memory_gb`` GiB); model state held as ``shard`` says on ``world_size`` ranks
    (default :data:`~datacentric.planning.sharding.DEFAULT_SHARD`, the trainer's, so
    ``simulate`` plans what ``train`` runs). The model reports the whole gradient
    reduction; :func:`run_policies` overlaps it with the slowest group's last backward
    when the setting does (``ddp``, ``fsdp2``: ``simulate(..., overlap_grad_sync=True)``).
    """
    return analytic_cost_model(
        model,
        hardware,
        memory_gb=memory_gb,
        memory_fraction=MEMORY_FRACTION,
        dtype_bytes=2,
        shard=shard,
        world_size=world_size,
    )


@dataclass(frozen=True)
class PolicyRun:
    """One policy's schedule and its simulation."""

    policy: str
    schedule: Schedule
    result: SimResult
    schedule_seconds: float
    """Wall time the scheduler took to build the epoch."""


def run_policies(
    shapes: Sequence[SampleShape],
    cost_model: CostModel,
    world_size: int,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    seed: int = 0,
    epoch: int = 0,
    record_spans: bool = False,
    options: ScheduleOptions | None = None,
    plan: Plan | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, PolicyRun]:
    """Schedule ``shapes`` with each policy and simulate the schedules.

    Every policy gets the same ``options`` and the same ``plan`` (by default the
    planner's, :func:`~datacentric.planning.planner.plan_buckets`, whose knapsack
    recomputation ``dcp-pac`` and ``dcp-opt`` may use), so policies are compared on
    equal terms. Efficiency is against the scheduler's ideal bound over the samples
    each schedule actually runs. With ``errors`` (a dict), a policy whose scheduling
    or simulation raises is left out of the result and its error recorded there
    (benchmarks report it); without, the error propagates.
    """
    shapes = list(shapes)
    if plan is None:
        plan = plan_buckets(make_buckets(shapes), cost_model, world_size=world_size)
    bounds: dict[tuple[int, ...], float] = {}
    runs: dict[str, PolicyRun] = {}
    for policy in policies:
        try:
            runs[policy] = _run_policy(
                policy,
                shapes,
                cost_model,
                world_size,
                plan,
                bounds,
                seed=seed,
                epoch=epoch,
                record_spans=record_spans,
                options=options,
            )
        except Exception as err:  # recorded for the caller, see the docstring
            if errors is None:
                raise
            errors[policy] = f"{type(err).__name__}: {err}"
    return runs


def _run_policy(
    policy: str,
    shapes: list[SampleShape],
    cost_model: CostModel,
    world_size: int,
    plan: Plan,
    bounds: dict[tuple[int, ...], float],
    *,
    seed: int,
    epoch: int,
    record_spans: bool,
    options: ScheduleOptions | None,
) -> PolicyRun:
    """Schedule and simulate one policy; ``bounds`` caches the ideal time per dropped set."""
    from datacentric.scheduling import build_schedule, ideal_epoch_time
    from datacentric.scheduling.measures import overlaps_grad_sync

    start = time.perf_counter()
    schedule = build_schedule(
        shapes,
        policy=policy,
        world_size=world_size,
        cost_model=cost_model,
        plan=plan,
        seed=seed,
        epoch=epoch,
        options=options,
        measure=False,
    )
    elapsed = time.perf_counter() - start
    dropped = schedule.dropped_sample_ids
    if dropped not in bounds:
        kept = sorted(set(range(len(shapes))) - set(dropped)) if dropped else None
        bounds[dropped] = ideal_epoch_time(
            shapes, cost_model, world_size, plan=plan, sample_ids=kept
        )
    result = simulate(
        schedule,
        shapes,
        cost_model,
        ideal_epoch_time_s=bounds[dropped],
        record_spans=record_spans,
        overlap_grad_sync=overlaps_grad_sync(cost_model, world_size),
    )
    return PolicyRun(policy, schedule, result, elapsed)


def policy_table(runs: dict[str, PolicyRun]) -> dict[str, dict[str, Any]]:
    """Per policy: ``tokens_per_s``, ``speedup_vs_static`` and
    ``speedup_vs_static_reference`` (None without that baseline), ``idle_share``,
    ``efficiency``, ``tokens_per_step_mean`` and the other headline numbers."""
    table: dict[str, dict[str, Any]] = {}
    for policy, run in runs.items():
        row = run.result.summary()
        row.pop("policy")
        for base, key in (
            ("static", "speedup_vs_static"),
            ("static-reference", "speedup_vs_static_reference"),
        ):
            ref = runs.get(base)
            row[key] = run.result.tokens_per_s / ref.result.tokens_per_s if ref else None
        steps = [it.num_tokens for it in run.schedule.iterations] or [0]
        row["tokens_per_step_mean"] = sum(steps) / len(steps)
        row["tokens_per_step_max"] = max(steps)
        row["samples_dropped"] = len(run.schedule.dropped_sample_ids)
        row["schedule_seconds"] = run.schedule_seconds
        table[policy] = row
    return table
