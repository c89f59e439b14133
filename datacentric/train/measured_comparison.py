"""Measured policy comparison: train the same samples under several policies, side by
side in one run, and set the simulator's prediction for the very same schedules beside
the measurement.

Used by ``datacentric bench`` and ``datacentric demo``. Every policy trains one epoch
of the same dataset from the same initial weights with the same cost model (one
dual-layer profile, measured in the first run and reused by the others), so every
policy processes exactly the same samples; policies differ in how they group them
into steps. Throughput is tokens over the summed step times of the whole epoch.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from datacentric.parallel.launch import launch
from datacentric.schedule import Schedule
from datacentric.sim.engine import IterationResult, MicroBatchSpan, SimResult, simulate
from datacentric.train.build import build_dataset, run_cost_model
from datacentric.train.config import TrainConfig
from datacentric.train.data_centric import EpochPlanner
from datacentric.train.metrics import read_metrics
from datacentric.train.trainer import train_rank


@dataclass
class PolicyMeasurement:
    """One policy's measured run and its simulated twin (steps after warm-up)."""

    policy: str
    tokens: int
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
    def predicted_tokens_per_s(self) -> float:
        return self.tokens / self.predicted_s

    @property
    def sim_rel_err(self) -> float:
        """|predicted - measured| / measured of the runtime's time."""
        return abs(self.predicted_s - self.runtime_s) / self.runtime_s


def run_policy(config: TrainConfig, world_size: int) -> None:
    """Train ``config`` on ``world_size`` fresh local ranks (gloo), from scratch."""
    shutil.rmtree(Path(config.out) / "checkpoints", ignore_errors=True)
    for name in ("metrics.jsonl", "samples.jsonl"):
        (Path(config.out) / name).unlink(missing_ok=True)
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
        planner = EpochPlanner(
            shapes,
            cost_model,
            world_size=world_size,
            policy=policy,
            memory_gb=config.memory_gb,
            tokens_per_iteration=config.tokens_per_iteration,
            seed=config.seed,
        )
        schedule = planner.schedule(0)
        records = read_metrics(config.out)
        if len(records) != len(schedule.iterations):
            raise RuntimeError(
                f"{policy}: {len(records)} steps were logged but epoch 0 has "
                f"{len(schedule.iterations)}; the run did not finish its epoch"
            )
        results[policy] = _measure(policy, schedule, records, shapes, cost_model, warmup)
    return results


def _measure(policy, schedule: Schedule, records, shapes, cost_model, warmup) -> PolicyMeasurement:
    kept = schedule.iterations[warmup : len(records)]
    used = {i for it in kept for i in it.sample_ids()}
    window = dataclasses.replace(
        schedule,
        iterations=kept,
        dropped_sample_ids=tuple(i for i in range(schedule.num_samples) if i not in used),
    )
    predicted = simulate(window, shapes, cost_model, record_spans=True)
    timed = records[warmup:]
    measured = measured_result(policy, window, timed)
    count = len(timed)
    return PolicyMeasurement(
        policy=policy,
        tokens=sum(r["tokens"] for r in timed),
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
    """A measured run in the simulator's result type (for the same plots and traces).

    Each group's micro-batch spans come from its first rank's timeline; iterations are
    laid end to end at their measured runtime time.
    """
    spans: list[MicroBatchSpan] = []
    iterations: list[IterationResult] = []
    clock = 0.0
    busy = 0.0
    tokens_total = samples = 0
    world = schedule.world_size
    for iteration, record in zip(schedule.iterations, records, strict=True):
        timeline = record["timeline"]
        ends = []
        tokens = 0
        for group in iteration.assignments:
            passes = timeline[group.rank_start]
            for k, (mb, (start, seconds)) in enumerate(zip(group.micro_batches, passes)):
                spans.append(
                    MicroBatchSpan(
                        iteration=iteration.index,
                        rank_start=group.rank_start,
                        sp_size=group.sp_size,
                        index=k,
                        bucket=mb.bucket,
                        start_s=clock + start,
                        end_s=clock + start + seconds,
                        samples=len(mb.sample_ids),
                        tokens=mb.tokens,
                        recompute_s=0.0,
                        comm_s=0.0,
                        memory_bytes=0,
                    )
                )
                busy += seconds * group.sp_size
                tokens += mb.tokens
                samples += len(mb.sample_ids)
            ends.append(passes[-1][0])  # when the group's gradient sync began
        makespan = max(ends)
        group_busy = sum(
            s * g.sp_size for g in iteration.assignments for _, s in timeline[g.rank_start][:-1]
        )
        iterations.append(
            IterationResult(
                index=iteration.index,
                start_s=clock,
                makespan_s=makespan,
                grad_sync_s=record["runtime_time_s"] - makespan,
                idle_share=1.0 - group_busy / (world * makespan),
                tokens=tokens,
            )
        )
        clock += record["runtime_time_s"]
        tokens_total += tokens
    return SimResult(
        policy=policy,
        world_size=world,
        iterations=tuple(iterations),
        tokens=tokens_total,
        samples=samples,
        busy_gpu_s=busy,
        recompute_gpu_s=0.0,
        comm_gpu_s=0.0,
        spans=tuple(spans),
    )
