"""Measured policy comparison: train the same samples under several policies, side by
side in one run, repeated, and set the simulator's prediction for the very same
schedules beside the measurement.

Used by ``datacentric bench`` and ``datacentric demo``. Every policy trains one epoch
of the same dataset from the same initial weights with the same cost model (one
dual-layer profile, measured in the first run and reused by the others), so every
policy processes exactly the same samples; policies differ in how they group them
into steps. Throughput is tokens over the summed step times of the whole epoch.

Each policy runs ``repeats`` times, interleaved (A B A B, so that a change in the
machine's load touches every policy alike), on the same global batches: the spread
between repeats of one policy (:attr:`PolicyRepeats.noise_rel`) says how large a
difference between policies must be to be more than noise, and a speedup is reported
as a range over the pairings of repeats (:func:`speedup_range`). The machine's load
around the runs and the CPU time the ranks got are recorded (:class:`LoadReading`).

The comparison reads back what each run stored: the schedule its epoch ran
(``schedules/epoch-0.json``) and the timing records of every step (the ``timeline``
of ``metrics.jsonl``), matched to the schedule's micro-batches by id.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datacentric.parallel.launch import launch
from datacentric.planning.cost_model import CostModel
from datacentric.profiling.store import PROBE_FILE, PROFILE_FILE
from datacentric.progress import Progress, counted
from datacentric.schedule import Iteration, Schedule
from datacentric.settings import TrainConfig
from datacentric.settings.sections import DataConfig
from datacentric.shapes import SampleShape
from datacentric.sim.engine import IterationResult, MicroBatchRun, SimResult, simulate
from datacentric.timing import (
    SYNC,
    Placement,
    Span,
    busy_s,
    micro_batch_id,
    placements,
    relative_spread,
)
from datacentric.train.assemble import Prechecked
from datacentric.train.build import (
    RunModel,
    RunPlace,
    build_dataset,
    run_cost_model,
    sharding,
)
from datacentric.train.comparison.comparison_stop import stopping_on_signals
from datacentric.train.comparison.machine_load import CpuClock, LoadReading, cores, load_average
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.reporting.timeline import timeline_spans
from datacentric.train.run_folder import load_schedule
from datacentric.train.trainer import train_rank

#: Runs of each policy in a comparison (``bench`` and ``demo``): two is the fewest that
#: show a spread.
DEFAULT_REPEATS = 2


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
    out: str = ""
    """The run folder."""

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


@dataclass(frozen=True)
class PolicyRepeats:
    """One policy's repeated runs (in the order they ran) on the same global batches."""

    policy: str
    runs: tuple[PolicyMeasurement, ...]

    @property
    def first(self) -> PolicyMeasurement:
        """The first run (its folder holds the plots' and the trace's steps)."""
        return self.runs[0]

    @property
    def tokens_per_s(self) -> float:
        """Median throughput over the repeats."""
        return statistics.median(r.tokens_per_s for r in self.runs)

    @property
    def runtime_s(self) -> float:
        """Median of the runtime's time over the repeats."""
        return statistics.median(r.runtime_s for r in self.runs)

    @property
    def predicted_s(self) -> float:
        """The simulator's time (the same for every repeat unless the profile changed)."""
        return statistics.median(r.predicted_s for r in self.runs)

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.first.tokens / self.predicted_s

    @property
    def noise_rel(self) -> float:
        """Largest relative difference between the step times of two repeats."""
        return relative_spread([r.measured_s for r in self.runs])

    @property
    def runtime_noise_rel(self) -> float:
        """The same for the runtime's part of the steps (what the simulator predicts)."""
        return relative_spread([r.runtime_s for r in self.runs])

    @property
    def sim_rel_err(self) -> float:
        """|predicted - median measured| / median measured of the runtime's time."""
        return abs(self.predicted_s - self.runtime_s) / self.runtime_s


def speedup_range(policy: PolicyRepeats, baseline: PolicyRepeats) -> tuple[float, float]:
    """The lowest and highest throughput ratio of ``policy`` over ``baseline`` over
    every pairing of a repeat of one with a repeat of the other. The ratio of medians
    lies within it."""
    ratios = [a.tokens_per_s / b.tokens_per_s for a in policy.runs for b in baseline.runs]
    return min(ratios), max(ratios)


@dataclass(frozen=True)
class Comparison:
    """Every policy's repeats, and how busy the machine was while they ran."""

    policies: dict[str, PolicyRepeats]
    load: LoadReading
    profiles: int = 1
    """Distinct profiles the runs planned with (above 1: a probe found the saved one off
    mid-comparison and it was measured again; each run is simulated with its own)."""


def run_order(policies: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, policy) in the order they run: every policy once per round, round
    after round (A B A B), so that a drift in the machine's load is shared."""
    return [(k, p) for k in range(repeats) for p in policies]


def repeat_folder(out: Path, policy: str, repeat: int) -> Path:
    """The run folder of ``policy``'s repeat ``repeat`` (0-based): ``out/<policy>``
    for the first, ``out/repeat-<k>/<policy>`` for the k-th (k >= 2)."""
    return out / policy if repeat == 0 else out / f"repeat-{repeat + 1}" / policy


def run_policy(
    config: TrainConfig, world_size: int, prechecked: Prechecked | None = None
) -> tuple[float, float, float]:
    """Train ``config`` on ``world_size`` fresh local ranks (gloo), from scratch
    (the folder's earlier run is replaced), with what the check before ranks start
    found (``prechecked``); returns the CPU seconds the ranks got over the run, their
    wall seconds, and their processes' whole CPU seconds (start-up included), each
    summed over ranks."""
    config = config.updated(
        job={"overwrite": True}, checkpoint={"resume": False, "resume_from": None}
    )
    clocks = launch(
        train_rank_clocked,
        config,
        prechecked,
        nproc=world_size,
        collective_timeout_s=config.parallelism.collective_timeout_s,
    )
    return tuple(sum(c[i] for c in clocks.values()) for i in range(3))  # type: ignore[return-value]


def train_rank_clocked(
    config: TrainConfig, prechecked: Prechecked | None = None
) -> tuple[float, float, float]:
    """:func:`train_rank`, returning this rank's CPU seconds (all its threads) and wall
    seconds over the run, and its process's CPU seconds since it started."""
    cpu, wall = time.process_time(), time.perf_counter()
    train_rank(config, prechecked=prechecked)
    end = time.process_time()
    return end - cpu, time.perf_counter() - wall, end


def compare_policies(
    base: TrainConfig,
    policies: list[str],
    world_size: int,
    out_dir: str | Path,
    *,
    warmup: int = 0,
    repeats: int = DEFAULT_REPEATS,
    prechecked: Prechecked | None = None,
) -> Comparison:
    """Train one epoch of ``base``'s dataset per policy, ``repeats`` times interleaved
    (:func:`run_order`, folders :func:`repeat_folder`), and measure; the first
    ``warmup`` steps of each run are left out of the timing. The profile is measured
    afresh at the start in ``out_dir/profile``, unless ``base.cost.profile_dir`` names one
    (then it is reused when its probe agrees). ``prechecked``: what the check before
    ranks start found (its sized global batch, its opened dataset), handed to every run."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    out = Path(out_dir)
    profile_dir = _comparison_profile(base.cost.profile_dir, out)
    shapes = _shapes(base.data, base.job.seed, prechecked)
    before, clock = load_average(), CpuClock.now()
    cpu_s = wall_s = process_s = 0.0
    cost_models: dict[str, CostModel] = {}
    # the model, not built here: read by its name once (on the meta device), placed per profile
    run_model = RunModel.of(base.model, base.lora)
    runs: dict[str, list[PolicyMeasurement]] = {p: [] for p in policies}
    order = run_order(policies, repeats)
    finished: list[tuple[str, int]] = []  # what a stop by a signal reports
    steps = RunSteps()
    what = f"{counted(len(policies), 'policy')} x {counted(repeats, 'run')}"
    with (
        Progress(what, len(order), unit="run", time_left=True, partial=steps) as bar,
        stopping_on_signals(finished, len(order), out),
    ):
        for k, (repeat, policy) in enumerate(order):
            steps.folder = repeat_folder(out, policy, repeat)
            bar.update(1 if k else 0, stage=f"{policy}, run {repeat + 1}")
            config = base.updated(
                scheduling={"policy": policy},
                job={"out": str(repeat_folder(out, policy, repeat))},
                cost={"profile_dir": str(profile_dir)},
                metrics={"timeline": True},
                checkpoint={"resume": False},
                training={"epochs": 1, "iterations": None},
            )
            cpu, wall, process = run_policy(config, world_size, prechecked)
            cpu_s, wall_s, process_s = cpu_s + cpu, wall_s + wall, process_s + process
            # the profile this run planned with: fresh on disk (measured or checked at its
            # start), so reading it here probes nothing
            saved = profile_dir / PROFILE_FILE
            key = saved.read_text(encoding="utf-8") if saved.exists() else ""
            if key not in cost_models:
                place = RunPlace(
                    torch.device("cpu"),
                    world_size,
                    sharding(config.parallelism),
                    config.job,
                    progress=config.metrics.progress,
                    shapes=shapes,
                )
                cost_models[key] = run_cost_model(run_model.placed(place), config.cost)
            measured = _read_run(policy, config.job.out, shapes, cost_models[key], warmup)
            runs[policy].append(measured)
            finished.append((policy, repeat))
        bar.update()
    load = LoadReading(
        cores=cores(),
        ranks=world_size,
        before=before,
        after=load_average(),
        rank_cpu_s=cpu_s,
        rank_wall_s=wall_s,
        others_cores=clock.others_cores(CpuClock.now(), ours_s=process_s),
    )
    return Comparison(
        policies={p: PolicyRepeats(p, tuple(r)) for p, r in runs.items()},
        load=load,
        profiles=len(cost_models),
    )


class RunSteps:
    """How far the training run in :attr:`folder` is, for the comparison's progress line:
    the steps its ``metrics.jsonl`` holds of its epoch's (from the schedule it saved)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self._steps: tuple[Path, int] | None = None  # the folder's epoch steps, read once

    def __call__(self) -> tuple[float, str] | None:
        """(share done, ``step N/M``), None before the run has saved its schedule."""
        folder = self.folder
        if folder is None:
            return None
        if self._steps is None or self._steps[0] != folder:
            try:
                self._steps = (folder, len(load_schedule(folder, 0).iterations))
            except (OSError, ValueError, KeyError):
                return None  # not written yet (or being written)
        total = self._steps[1]
        try:
            with open(folder / "metrics.jsonl", "rb") as lines:
                done = sum(1 for _ in lines)
        except OSError:
            done = 0
        return min(done / max(total, 1), 1.0), f"step {done}/{total}"


def _shapes(data: DataConfig, seed: int, prechecked: Prechecked | None) -> list[SampleShape]:
    """The runs' sample shapes: of the dataset the check before ranks start opened in
    this process, else of the ``[data]`` section's, opened here."""
    if prechecked is not None and prechecked.data is not None:
        return prechecked.data[0].shapes()
    return build_dataset(data, seed).shapes()


def _comparison_profile(given: str | None, out: Path) -> Path:
    """The profile folder a comparison plans with: ``given`` (``[cost] profile_dir``),
    else ``out/profile`` emptied of an earlier profile."""
    if given is not None:
        return Path(given)
    # the comparison's own profile is part of its measurement: measured afresh at its
    # start, as its earlier runs are replaced (a profile from an earlier session passes
    # its probe while the machine runs up to its tolerance slower or faster)
    for name in (PROFILE_FILE, PROBE_FILE):
        (out / "profile" / name).unlink(missing_ok=True)
    return out / "profile"


def _read_run(policy, out: str, shapes, cost_model, warmup) -> PolicyMeasurement:
    """The measurement of ``policy``'s finished run in folder ``out`` (``[job] out``)."""
    schedule = load_schedule(out, 0)
    records = read_metrics(out)
    if len(records) != len(schedule.iterations):
        raise RuntimeError(
            f"{policy}: {counted(len(records), 'step')} logged in {out} but epoch 0 has "
            f"{len(schedule.iterations)}; the run did not finish its epoch"
        )
    return dataclasses.replace(
        _measure(policy, schedule, records, shapes, cost_model, warmup), out=out
    )


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
