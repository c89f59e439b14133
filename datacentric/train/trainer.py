"""The training loop behind ``datacentric train`` (one call per rank).

Every rank builds the same model (same seed), dataset, cost model and schedule,
with no communication; then each optimizer step runs the rank's micro-batches
through :class:`~datacentric.parallel.runtime.DataCentricRuntime` (one gradient
all-reduce per step), clips, steps the optimizer and the learning-rate schedule
once, logs, and checkpoints. Resuming continues the sample stream exactly where
the checkpoint left it; on a different world size the rest of the epoch is
re-planned (see :mod:`datacentric.train.position`).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.runtime import IterationStats
from datacentric.schedule import Iteration
from datacentric.scheduling.measures import iteration_imbalance
from datacentric.train.build import build_dataset, build_model_for, run_cost_model
from datacentric.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    weights_sha256,
)
from datacentric.train.config import TrainConfig, parse_fault
from datacentric.train.data_centric import DataCentric
from datacentric.train.metrics import MetricsLogger
from datacentric.train.position import Position, next_epoch, segment_schedule


class NonFiniteLossError(RuntimeError):
    """The loss of an optimizer step is NaN or infinite; the step was not applied."""


@dataclass
class TrainResult:
    """What a rank's run did."""

    iterations_done: int
    samples_seen: int
    losses: list[float]
    tokens_per_s: list[float]
    weights_sha256: str
    out_dir: str


def lr_lambda(config: TrainConfig, total: int):
    """Multiplier of the peak learning rate at optimizer step ``n`` (0-based)."""

    def factor(n: int) -> float:
        if config.warmup_iterations and n < config.warmup_iterations:
            return (n + 1) / config.warmup_iterations
        if config.lr_schedule == "constant":
            return 1.0
        span = max(1, total - config.warmup_iterations)
        progress = min(1.0, (n - config.warmup_iterations) / span)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _gather_floats(values: list[float], groups: ProcessGroups) -> torch.Tensor:
    """``(world, len(values))`` float64 table of every rank's values (one collective)."""
    mine = torch.tensor(values, dtype=torch.float64, device=groups.device)
    if not groups.distributed or groups.world_size == 1:
        return mine.unsqueeze(0).cpu()
    table = [torch.empty_like(mine) for _ in range(groups.world_size)]
    dist.all_gather(table, mine, group=groups.world)
    return torch.stack(table).cpu()


class Trainer:
    """One rank's training run; construct on every rank after ``groups`` exist."""

    def __init__(self, config: TrainConfig, groups: ProcessGroups) -> None:
        self.config = config
        self.groups = groups
        self.out = Path(config.out)
        self.is_main = groups.rank == 0
        torch.manual_seed(config.seed)
        self.dataset = build_dataset(config)
        self.model = build_model_for(config, self.dataset)
        self.shapes = self.dataset.shapes()
        self.dc = DataCentric(
            self.model,
            self.dataset,
            policy=config.policy,
            cost_model=run_cost_model(
                config, groups.world_size, groups.device, self.shapes, is_main=self.is_main
            ),
            memory_gb=config.memory_gb,
            tokens_per_iteration=config.tokens_per_iteration,
            seed=config.seed,
            groups=groups,
        )
        self.runtime = self.dc.runtime
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.position = Position()
        self.total_iterations = 0
        self._pending_schedule = None  # built at start-up to count steps, used once
        self.fault = parse_fault(config.fault_inject) if config.fault_inject else None

    # ---------------------------------------------------------------- schedule
    def _schedule(self):
        if self._pending_schedule is not None:
            schedule, self._pending_schedule = self._pending_schedule, None
            return schedule
        return segment_schedule(
            self.position, len(self.shapes), self.groups.world_size, self.dc.schedule
        )

    def _planned_total(self) -> int:
        if self.config.iterations is not None:
            return self.config.iterations
        self._pending_schedule = self._schedule()
        return self.config.epochs * len(self._pending_schedule.iterations)

    # ---------------------------------------------------------------- resume
    def _resume(self) -> None:
        # A torchrun restart (--max-restarts) always continues from the last checkpoint.
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        path = latest_checkpoint(self.out) if self.config.resume or restarted else None
        if path is None:
            self.total_iterations = self._planned_total()
            return
        state = load_checkpoint(path, self.model, self.optimizer)
        self.position = Position.from_json(state["position"])
        self.total_iterations = int(state["total_iterations"])
        if self.is_main:
            _truncate_jsonl(self.out / "metrics.jsonl", self.position.iterations_done)
            _truncate_jsonl(self.out / "samples.jsonl", self.position.iterations_done)

    def _trainer_state(self, lr_state: dict[str, Any]) -> dict[str, Any]:
        return {
            "position": self.position.to_json(),
            "iterations_done": self.position.iterations_done,
            "samples_seen": self.position.samples_seen,
            "epoch": self.position.epoch,
            "world_size": self.groups.world_size,
            "total_iterations": self.total_iterations,
            "lr_scheduler": lr_state,
            "config": self.config.to_json(),
        }

    # ---------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train until ``config.iterations`` steps or ``config.epochs`` epochs are done."""
        config = self.config
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            config.save(self.out / "config.json")
            plan = self.dc.planner.plan.to_json()
            (self.out / "plan.json").write_text(json.dumps(plan, indent=1), encoding="utf-8")
        self._resume()
        for group in self.optimizer.param_groups:
            # The schedule multiplies the configured peak; a loaded optimizer state holds
            # the decayed rate of its last step, which must not become the new base.
            group["initial_lr"] = config.lr
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(config, self.total_iterations)
        )
        if self.position.iterations_done:
            # LambdaLR is a pure function of the step count: replay it, no state needed.
            scheduler.last_epoch = self.position.iterations_done - 1
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                scheduler.step()
        metrics = MetricsLogger(
            self.out,
            enabled=self.is_main,
            total=self.total_iterations,
            initial=self.position.iterations_done,
            progress=config.progress,
        )
        losses: list[float] = []
        rates: list[float] = []
        try:
            while not self._finished():
                schedule = self._schedule()
                self.dc.set_epoch(self.position.epoch)
                iterations = schedule.iterations[self.position.segment_iteration :]
                for iteration in iterations:
                    if self._finished():
                        break
                    record = self._step(iteration, scheduler)
                    losses.append(record["loss"])
                    rates.append(record["tokens_per_s"])
                    metrics.log(record)
                    every = config.checkpoint_every
                    if every and self.position.iterations_done % every == 0:
                        self._save(scheduler)
                if self.position.segment_iteration >= len(schedule.iterations):
                    next_epoch(self.position)
            self._save(scheduler)
        finally:
            metrics.close()
        return TrainResult(
            iterations_done=self.position.iterations_done,
            samples_seen=self.position.samples_seen,
            losses=losses,
            tokens_per_s=rates,
            weights_sha256=weights_sha256(self.model.state_dict()),
            out_dir=str(self.out),
        )

    def _finished(self) -> bool:
        p = self.position
        if self.config.iterations is not None:
            return p.iterations_done >= self.config.iterations
        return p.epoch >= self.config.epochs

    def _save(self, scheduler) -> None:
        save_checkpoint(
            self.out,
            self.position.iterations_done,
            self.model,
            self.optimizer,
            self._trainer_state(scheduler.state_dict()),
        )

    def _maybe_inject_fault(self) -> None:
        """Kill (or hang) this rank after its first micro-batch of the step named by the
        fault-injection setting, once per run folder (a marker file records it)."""
        if self.fault is None:
            return
        rank, at, mode = self.fault
        marker = self.out / f".fault-injected-rank{rank}-at{at}"
        if self.groups.rank == rank and self.position.iterations_done == at:
            if not marker.exists():
                marker.touch()
                if mode == "hang":
                    time.sleep(10 * self.config.collective_timeout_s)
                os._exit(17)

    def _step(self, iteration: Iteration, scheduler) -> dict[str, Any]:
        config = self.config
        self.optimizer.zero_grad(set_to_none=True)
        started = time.perf_counter()
        autocast = torch.autocast(
            device_type=self.groups.device.type,
            dtype=torch.bfloat16,
            enabled=config.dtype == "bfloat16",
        )
        runtime = self.runtime
        phase = "setup"
        try:
            stats = runtime.start_iteration(iteration)
            group = iteration.assignment_for_rank(self.groups.rank)
            for k, micro in enumerate(runtime.micro_steps(iteration, stats)):
                phase = (
                    f"micro-batch {k} (forward/backward with the SP all-to-all of the group of "
                    f"{group.sp_size} at rank {group.rank_start})"
                )
                with autocast:
                    loss_S = self.model(micro.batch)
                micro.backward(loss_S)
                if k == 0:
                    self._maybe_inject_fault()
            phase = "the gradient all-reduce over the world"
            runtime.finish_iteration(stats)
            phase = "the all-gather of losses and timings"
            compute_s = sum(mb.time_s for mb in stats.micro_batches)
            table = _gather_floats(
                [stats.weighted_loss, compute_s, stats.total_time_s], self.groups
            )
        except RuntimeError as err:
            timed_out = "timed out" in str(err).lower() or "timeout" in str(err).lower()
            raise RuntimeError(
                f"rank {self.groups.rank}: iteration {self.position.iterations_done} "
                f"{'timed out' if timed_out else 'failed'} in {phase}"
                f"{' (a peer rank stopped answering?)' if timed_out else ''}: {err}"
            ) from err
        loss = float(table[:, 0].sum())
        sample_ids = iteration.sample_ids()
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"iteration {self.position.iterations_done} (epoch {self.position.epoch}): loss "
                f"is {loss}; samples {sorted(sample_ids)}. The step was not applied and the "
                "last checkpoint is intact; lower the learning rate or inspect these samples"
            )
        if config.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        scheduler.step()
        elapsed = time.perf_counter() - started
        tokens = sum(self.shapes[i].tokens for i in sample_ids)
        step = self.position.iterations_done
        p = self.position
        p.iterations_done += 1
        p.samples_seen += len(sample_ids)
        p.segment_iteration += 1
        p.consumed.extend(sample_ids)
        busy = table[:, 1]
        wall = float(table[:, 2].max())
        if self.is_main:
            with open(self.out / "samples.jsonl", "a", encoding="utf-8") as handle:
                handle.write(
                    json.dumps({"iteration": step, "epoch": p.epoch, "sample_ids": sample_ids})
                    + "\n"
                )
        return {
            "iteration": step,
            "epoch": p.epoch,
            "loss": loss,
            "lr": lr,
            "samples": len(sample_ids),
            "tokens": tokens,
            "iteration_time_s": elapsed,
            "tokens_per_s": tokens / elapsed,
            "est_makespan_s": iteration.est_makespan_s,
            "est_idle_share": iteration_imbalance(iteration, self.groups.world_size),
            "measured_idle_share": 1.0 - float(busy.sum()) / (len(busy) * wall) if wall else 0.0,
            "groups": [
                [a.rank_start, a.sp_size, a.accumulation_steps] for a in iteration.assignments
            ],
            "rank_compute_s": [float(x) for x in busy],
            "runtime_time_s": wall,
            **({"timeline": self._timeline(stats)} if config.timeline else {}),
        }

    def _timeline(self, stats: IterationStats) -> list[list[list[float]]]:
        """Every rank's ``[start_s, seconds]`` per micro-batch, then ``[sync start,
        sync seconds]`` (collective; rank-indexed)."""
        mine = [[mb.start_s, mb.time_s] for mb in stats.micro_batches]
        mine.append([stats.total_time_s - stats.sync_time_s, stats.sync_time_s])
        if not self.groups.distributed or self.groups.world_size == 1:
            return [mine]
        everyone: list = [None] * self.groups.world_size
        dist.all_gather_object(everyone, mine, group=self.groups.world)
        return everyone


def train_rank(config: TrainConfig, groups: ProcessGroups | None = None) -> TrainResult:
    """Run one rank of a training job (inside ``launch.spawn``, torchrun, or alone)."""
    if groups is None:
        groups = ProcessGroups() if dist.is_available() and dist.is_initialized() else None
        groups = groups or ProcessGroups.local()
    return Trainer(config, groups).run()


def _truncate_jsonl(path: Path, keep_below: int) -> None:
    """Keep records whose ``iteration`` < ``keep_below`` (steps after the checkpoint
    are re-run on resume and must not be logged twice)."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [ln for ln in lines if ln.strip() and json.loads(ln)["iteration"] < keep_below]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    os.replace(tmp, path)
