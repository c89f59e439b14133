"""The training loop behind ``datacentric train`` (one call per rank).

Every rank builds the same model (same seed), dataset, cost model and schedule,
with no communication; then the trainer drives the very loop a user writes over
:class:`~datacentric.train.data_centric.DataCentric`: each step's micro-batches
(one gradient all-reduce per step), then it clips, steps the optimizer and the
learning-rate schedule once, logs, and checkpoints ``DataCentric``'s position.
Resuming continues the sample stream exactly where the checkpoint left it; on a
different world size the rest of the epoch is re-planned (see
:mod:`datacentric.scheduling.resume`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch_mode, process_groups
from datacentric.scheduling.measures import iteration_imbalance
from datacentric.scheduling.resume import Position
from datacentric.train.build import build_dataset, build_model_for, run_cost_model
from datacentric.train.checkpoint import (
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    resolve_resume_from,
    save_checkpoint,
    weights_sha256,
)
from datacentric.train.config import TrainConfig, parse_fault, section_keys, sharding
from datacentric.train.data_centric import DataCentric, Step, ulysses_sp_sizes
from datacentric.train.metrics import MetricsLogger, StepMetrics, full_model_state
from datacentric.train.run_folder import (
    claim_run_folder,
    gather_spans,
    save_schedule,
    timeline_json,
)

#: Settings a resume must keep (the sample stream and the model depend on them); the
#: rest (steps, learning rate, checkpointing, world size...) may change.
RESUME_FIXED = (*(k for s in ("model", "data", "scheduling") for k in section_keys()[s]), "seed")


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


class Trainer:
    """One rank's training run; construct on every rank after ``groups`` exist."""

    def __init__(self, config: TrainConfig, groups: ProcessGroups) -> None:
        self.config = config
        self.groups = groups
        self.out = Path(config.out)
        self.is_main = groups.rank == 0
        torch.manual_seed(config.seed)
        self.dataset = build_dataset(config)
        module = build_model_for(config, self.dataset)
        self.shapes = self.dataset.shapes()
        self.dc = DataCentric(
            module,
            self.dataset,
            policy=config.policy,
            cost_model=run_cost_model(
                config,
                groups.world_size,
                groups.device,
                self.shapes,
                is_main=self.is_main,
                model=module,
                dataset=self.dataset,
                sp_sizes=ulysses_sp_sizes(module, groups.world_size),
            ),
            memory_gb=config.memory_gb,
            tokens_per_iteration=config.tokens_per_iteration,
            seed=config.seed,
            groups=groups,
            shard=sharding(config),
            options=config.schedule_options(),
            compile=config.compile,
            # a resumed run keeps the model and data its first start checked (the resume
            # checks refuse any change), and names a changed model by the checkpoint's
            check_model=not (config.resume or config.resume_from),
        )
        self.runtime = self.dc.runtime
        self.model = self.dc.model  # wrapped or sharded: the optimizer takes its parameters
        self.step_metrics = StepMetrics(config, self.dc, groups)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.total_iterations = 0
        self.fault = parse_fault(config.fault_inject) if config.fault_inject else None

    @property
    def position(self) -> Position:
        """Where the run stands (``DataCentric``'s position, saved in checkpoints)."""
        return self.dc.position

    def _planned_total(self) -> int:
        if self.config.iterations is not None:
            return self.config.iterations
        return self.config.epochs * len(self.dc.current_schedule().iterations)

    # ---------------------------------------------------------------- resume
    def _checkpoint_to_load(self, restarted: bool) -> Path | None:
        if self.config.resume_from:
            return resolve_resume_from(self.out, self.config.resume_from)
        if not (self.config.resume or restarted):
            return None
        path, notice = find_checkpoint(self.out)
        if notice and self.is_main:
            print(f"datacentric train: note: {notice}", file=sys.stderr)
        return path

    def _resume(self) -> None:
        # A torchrun restart (--max-restarts) always continues from the last checkpoint.
        restarted = launch_mode().restarts > 0
        path = self._checkpoint_to_load(restarted)
        if path is None:
            self.total_iterations = self._planned_total()
            if self.is_main:  # a fresh start: records of an earlier attempt go
                _truncate_jsonl(self.out / "metrics.jsonl", 0)
                _truncate_jsonl(self.out / "samples.jsonl", 0)
            return
        state = load_checkpoint(path, self.model, self.optimizer, expect_model=self.config.model)
        self._check_unchanged(path, state)
        self.dc.load_state_dict(state["position"])
        done = self.position.iterations_done
        was = int(state["total_iterations"])
        self.total_iterations = self._resumed_total(was, state.get("config") or {})
        if self.is_main:
            new = self.total_iterations
            change = f" (the checkpoint's run planned {was})" if was != new else ""
            print(
                f"datacentric train: resuming from {path.name} at step {done}; learning-rate "
                f"horizon {self.total_iterations} steps{change}",
                file=sys.stderr,
            )
            _truncate_jsonl(self.out / "metrics.jsonl", done)
            _truncate_jsonl(self.out / "samples.jsonl", done)

    def _resumed_total(self, was: int, saved: dict[str, Any]) -> int:
        """The learning-rate horizon of a resumed run: this command's ``iterations``;
        without it, the saved horizon scaled by a changed ``epochs``."""
        if self.config.iterations is not None:
            return self.config.iterations
        saved_epochs = int(saved.get("epochs", self.config.epochs))
        return max(1, round(was * self.config.epochs / saved_epochs))

    def _check_unchanged(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse a resume whose data, model or schedule settings differ from the
        checkpoint's (any world size), naming each changed setting."""
        saved = state.get("config") or {}
        now = self.config.to_json()
        changed = [
            f"{key} ({saved[key]!r} -> {now[key]!r})"
            for key in RESUME_FIXED
            if key in saved and _as_json(saved[key]) != _as_json(now[key])
        ]
        fingerprint = state.get("dataset_fingerprint")
        if fingerprint is not None and fingerprint != self._dataset_fingerprint():
            changed.append("the dataset's samples")
        if changed:
            raise CheckpointError(
                f"cannot resume from {path}: changed since it was saved: {', '.join(changed)}; "
                "resume with the same settings, or start a new run (another --out or --overwrite)"
            )

    def _dataset_fingerprint(self) -> str:
        """SHA-256 of the dataset's sample shapes, in order."""
        return hashlib.sha256(repr(list(self.shapes)).encode()).hexdigest()

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
            "dataset_fingerprint": self._dataset_fingerprint(),
        }

    # ---------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train until ``config.iterations`` steps or ``config.epochs`` epochs are done."""
        config = self.config
        if self.is_main:
            claim_run_folder(config, restarted=launch_mode().restarts > 0)
        self._resume()  # checks the checkpoint before anything in the folder changes
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            config.save(self.out / "config.json")
            (self.out / "config.toml").write_text(config.to_toml(), encoding="utf-8")
            plan = self.dc.pipeline.plan.to_json(self.dc.pipeline.cost_model)
            (self.out / "plan.json").write_text(json.dumps(plan, indent=1), encoding="utf-8")
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
        epochs = config.epochs if config.iterations is None else None
        try:
            saved = None
            for step in self.dc.steps(epochs, iterations=config.iterations):
                schedule = self.dc.current_schedule()
                if self.is_main and schedule is not saved:  # the schedule that runs, once
                    replanned = self.position.segment_excluded
                    at_step = self.position.iterations_done if replanned else None
                    save_schedule(self.out, schedule, at_step)
                    saved = schedule
                record = self._step(step, scheduler)
                losses.append(record["loss"])
                rates.append(record["tokens_per_s"])
                metrics.log(record)
                every = config.checkpoint_every
                if every and self.position.iterations_done % every == 0:
                    self._save(scheduler)
            self._save(scheduler)
        finally:
            metrics.close()
            self.dc.close()
        return TrainResult(
            iterations_done=self.position.iterations_done,
            samples_seen=self.position.samples_seen,
            losses=losses,
            tokens_per_s=rates,
            weights_sha256=weights_sha256(full_model_state(self.model)),
            out_dir=str(self.out),
        )

    def _save(self, scheduler) -> None:
        save_checkpoint(
            self.out,
            self.position.iterations_done,
            self.model,
            self.optimizer,
            self._trainer_state(scheduler.state_dict()),
            keep_last=self.config.keep_last,
        )

    def _maybe_inject_fault(self, number: int) -> None:
        """Kill (or hang) this rank after its first micro-batch of the step named by the
        fault-injection setting, once per run folder (a marker file records it)."""
        if self.fault is None:
            return
        rank, at, mode = self.fault
        marker = self.out / f".fault-injected-rank{rank}-at{at}"
        if self.groups.rank == rank and number == at:
            if not marker.exists():
                marker.touch()
                if mode == "hang":
                    time.sleep(10 * self.config.collective_timeout_s)
                os._exit(17)

    def _step(self, step: Step, scheduler) -> dict[str, Any]:
        """Run one step of ``DataCentric.steps()``: the user loop's body plus mixed
        precision, fault injection, clipping and the step's metrics record."""
        config = self.config
        self.optimizer.zero_grad(set_to_none=True)
        self.step_metrics.start()
        started = time.perf_counter()
        autocast = torch.autocast(
            device_type=self.groups.device.type,
            dtype=torch.bfloat16,
            enabled=config.dtype == "bfloat16",
        )
        try:
            for k, micro in enumerate(step):
                with autocast:
                    loss_S = self.model(micro.batch)
                micro.backward(loss_S)
                if k == 0:
                    self._maybe_inject_fault(step.number)
            loss = step.finish()
        except RuntimeError as err:
            timed_out = "timed out" in str(err).lower() or "timeout" in str(err).lower()
            raise RuntimeError(
                f"rank {self.groups.rank}: iteration {step.number} "
                f"{'timed out' if timed_out else 'failed'} in {step.phase}"
                f"{' (a peer rank stopped answering?)' if timed_out else ''}: {err}"
            ) from err
        iteration, stats = step.iteration, step.stats
        sample_ids = step.sample_ids
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"iteration {step.number} (epoch {step.epoch}): loss "
                f"is {loss}; samples {sorted(sample_ids)}. The step was not applied and the "
                "last checkpoint is intact; lower the learning rate or inspect these samples"
            )
        # The norm before clipping, over the whole gradient (every shard under FSDP2).
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), config.grad_clip or math.inf
        )
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        scheduler.step()
        elapsed = time.perf_counter() - started
        tokens = sum(self.shapes[i].tokens for i in sample_ids)
        step_index, epoch = step.number, step.epoch
        busy = step.rank_compute_s
        wall = step.runtime_time_s
        if self.is_main:
            with open(self.out / "samples.jsonl", "a", encoding="utf-8") as handle:
                handle.write(
                    json.dumps({"iteration": step_index, "epoch": epoch, "sample_ids": sample_ids})
                    + "\n"
                )
        return {
            "iteration": step_index,
            "epoch": epoch,
            "loss": loss,
            "lr": lr,
            "samples": len(sample_ids),
            "tokens": tokens,
            "iteration_time_s": elapsed,
            "tokens_per_s": tokens / elapsed,
            "est_makespan_s": iteration.est_makespan_s,
            "est_idle_share": iteration_imbalance(iteration, self.groups.world_size),
            "measured_idle_share": 1.0 - sum(busy) / (len(busy) * wall) if wall else 0.0,
            "groups": [
                [a.rank_start, a.sp_size, a.accumulation_steps]
                + ([a.phase] if iteration.num_phases > 1 else [])
                for a in iteration.assignments
            ],
            "rank_compute_s": busy,
            "runtime_time_s": wall,
            "data_wait_s": step.data_wait_s,
            **self.step_metrics.record(step, grad_norm, self.optimizer, tokens, elapsed),
            **(
                {"timeline": timeline_json(gather_spans(stats, self.groups))}
                if config.timeline
                else {}
            ),
        }


def train_rank(config: TrainConfig, groups: ProcessGroups | None = None) -> TrainResult:
    """Run one rank of a training job (inside ``launch.launch``: spawned, under
    torchrun, or alone)."""
    groups = groups or process_groups(config.collective_timeout_s, device=config.device)
    return Trainer(config, groups).run()


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


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
