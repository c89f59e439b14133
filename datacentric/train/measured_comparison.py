"""Measured policy comparison: train the same samples under several policies, side by
side in one run, and set the simulator's prediction for the very same schedules beside
the measurement.

Used by ``datacentric bench`` and ``datacentric demo``. Every policy trains one epoch
of the same dataset from the same initial weights with the same cost model (one
dual-layer profile, measured in the first run and reused by the others), so every
policy processes exactly the same samples; policies differ in how they group them
into steps. Throughput is tokens over the summed step times of the whole epoch.

The comparison reads back what each run stored: the schedule its epoch ran
(``schedules/epoch-0.json``) and the timing records of every step (the ``timeline``
of ``metrics.jsonl``), matched to the schedule's micro-batches by id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datacentric.parallel.launch import launch
from datacentric.schedule import Iteration, Schedule
from datacentric.sim.engine import IterationResult, MicroBatchRun, SimResult, simulate
from datacentric.timing import SYNC, Placement, Span, busy_s, micro_batch_id, placements
from datacentric.train.build import build_dataset, run_cost_model
from datacentric.train.config import TrainConfig
from datacentric.train.metrics import read_metrics
from datacentric.train.run_folder import load_schedule, timeline_spans
from datacentric.train.trainer import train_rank


@dataclass
class PolicyMeasurement:
    """One policy's measured run and its simulated twin (steps after warm-up)."""

    policy: str
    tokens: int
    steps: int
    """Optimizer steps timed (after warm-up)."""
    measured_s: float
    """Sum of whole optimizer-step wall times (runtime, clipping, optimizer, logging)."""
    runtime_s: float
    """Sum of the runtime's part of each step (passes and gradient all-reduce), slowest rank."""
    predicted_s: float
    """The simulator's time for the same iterations."""
    losses: list[float]
    measured_idle_share: float
    est_idle_share: float
    measured: SimResult
    predicted: SimResult

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.measured_s

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens per optimizer step: the same for every policy at one global batch."""
        return self.tokens / self.steps

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.tokens / self.predicted_s

    @property
    def sim_rel_err(self) -> float:
        """|predicted - measured| / measured of the runtime's time."""
        return abs(self.predicted_s - self.runtime_s) / self.runtime_s


def run_policy(config: TrainConfig, world_size: int) -> None:
    """Train ``config`` on ``world_size`` fresh local ranks (gloo), from scratch
    (the folder's earlier run is replaced)."""
    config = dataclasses.replace(config, overwrite=True, resume=False, resume_from=None)
    launch(train_rank, config, nproc=world_size, collective_timeout_s=config.collective_timeout_s)


def compare_policies(
    base: TrainConfig,
    policies: list[str],
    world_size: int,
    out_dir: str | Path,
    *,
    warmup: int = 0,
) -> dict[str, PolicyMeasurement]:
    """Train one epoch of ``base``'s dataset per policy (under ``out_dir/<policy>``) and
    measure; the first ``warmup`` steps are left out of the timing."""
    out = Path(out_dir)
    runs = {}
    for policy in policies:
        config = dataclasses.replace(
            base,
            policy=policy,
            out=str(out / policy),
            profile_dir=base.profile_dir or str(out / "profile"),
            timeline=True,
            resume=False,
            epochs=1,
            iterations=None,
        )
        run_policy(config, world_size)
        runs[policy] = config
    first = next(iter(runs.values()))
    dataset = build_dataset(first)
    shapes = dataset.shapes()
    cost_model = run_cost_model(first, world_size, torch.device("cpu"), shapes)
    results = {}
    for policy, config in runs.items():
        schedule = load_schedule(config.out, 0)
        records = read_metrics(config.out)
        if len(records) != len(schedule.iterations):
            raise RuntimeError(
                f"{policy}: {len(records)} steps were logged but epoch 0 has "
                f"{len(schedule.iterations)}; the run did not finish its epoch"
            )
        results[policy] = _measure(policy, schedule, records, shapes, cost_model, warmup)
    return results


def _measure(policy, schedule: Schedule, records, shapes, cost_model, warmup) -> PolicyMeasurement:
    timed = records[warmup:]
    measured = measured_result(policy, schedule, timed)
    ran = {it.index for it in measured.iterations}
    kept = tuple(it for it in schedule.iterations if it.index in ran)
    used = {i for it in kept for i in it.sample_ids()}
    window = dataclasses.replace(
        schedule,
        iterations=kept,
        dropped_sample_ids=tuple(i for i in range(schedule.num_samples) if i not in used),
    )
    predicted = simulate(window, shapes, cost_model, record_spans=True)
    count = len(timed)
    return PolicyMeasurement(
        policy=policy,
        tokens=sum(r["tokens"] for r in timed),
        steps=count,
        measured_s=sum(r["iteration_time_s"] for r in timed),
        runtime_s=sum(r["runtime_time_s"] for r in timed),
        predicted_s=predicted.epoch_time_s,
        losses=[r["loss"] for r in records],
        measured_idle_share=sum(r["measured_idle_share"] for r in timed) / count,
        est_idle_share=sum(r["est_idle_share"] for r in timed) / count,
        measured=measured,
        predicted=predicted,
    )


def measured_result(policy: str, schedule: Schedule, records) -> SimResult:
    """Measured steps in the simulator's result type (for the same plots and traces).

    ``schedule`` is the one the steps ran; each step's spans (its record's
    ``timeline``) name their micro-batches by id, which places the step in the
    schedule: records may come in any order and spans in any order within a record.
    Steps are laid end to end at their measured runtime time, in record order. A
    step's makespan ends when the last rank reached the gradient sync.
    """
    where = placements(schedule)
    spans: list[Span] = []
    iterations: list[IterationResult] = []
    runs: dict[int, MicroBatchRun] = {}
    clock = busy = 0.0
    world = schedule.world_size
    for record in records:
        mine = timeline_spans(record)
        iteration = _iteration_of(mine, where, record)
        makespan = max(
            [s.start_s for s in mine if s.kind == SYNC]
            or [s.end_s for s in mine if s.micro_batch is not None]
        )
        tokens = 0
        for group in iteration.assignments:
            for mb in group.micro_batches:
                run = MicroBatchRun.of(iteration.index, group, mb)
                runs[run.id] = run
                tokens += run.tokens
        step_busy = busy_s(mine)
        iterations.append(
            IterationResult(
                index=iteration.index,
                start_s=clock,
                makespan_s=makespan,
                grad_sync_s=record["runtime_time_s"] - makespan,
                idle_share=1.0 - step_busy / (world * makespan),
                tokens=tokens,
            )
        )
        spans.extend(
            dataclasses.replace(s, iteration=iteration.index, start_s=s.start_s + clock)
            for s in mine
        )
        busy += step_busy
        clock += record["runtime_time_s"]
    return SimResult(
        policy=policy,
        world_size=world,
        iterations=tuple(iterations),
        tokens=sum(it.tokens for it in iterations),
        samples=sum(run.samples for run in runs.values()),
        busy_gpu_s=busy,
        recompute_gpu_s=0.0,
        comm_gpu_s=0.0,
        spans=tuple(spans),
        micro_batches=runs,
        device="cpu",
    )


def _iteration_of(
    spans: list[Span], where: Mapping[int, Placement], record: dict[str, Any]
) -> Iteration:
    """The schedule's iteration whose micro-batches ``spans`` name (exactly one, and
    every one of its micro-batches timed on every rank of its group)."""
    step = record.get("iteration")
    named = {s.micro_batch for s in spans if s.micro_batch is not None}
    unknown = sorted(named - set(where))
    if unknown:
        raise ValueError(
            f"step {step}: micro-batches {unknown[:5]} are not in the schedule that was read"
        )
    found = {where[i].iteration.index: where[i].iteration for i in named}
    if len(found) != 1:
        raise ValueError(
            f"step {step}: its spans name micro-batches of iterations {sorted(found)}, "
            "not of one iteration of the schedule"
        )
    (iteration,) = found.values()
    timed = {(s.micro_batch, s.rank) for s in spans if s.micro_batch is not None}
    for group in iteration.assignments:
        for mb in group.micro_batches:
            missing = [r for r in group.ranks if (micro_batch_id(mb), r) not in timed]
            if missing:
                raise ValueError(
                    f"step {step}: micro-batch {micro_batch_id(mb)} of iteration "
                    f"{iteration.index} has no timing on ranks {missing}"
                )
    return iteration
