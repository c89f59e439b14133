"""The training loop behind ``datacentric train`` (one call per rank).

Every rank builds the same model (same seed), dataset, cost model and schedule,
with no communication; then the trainer drives the very loop a user writes over
:class:`~datacentric.train.data_centric.DataCentric`: each step's micro-batches
(one gradient all-reduce per step), then it clips, steps the optimizer and the
learning-rate schedule once, logs, and checkpoints ``DataCentric``'s position.
Resuming continues the sample stream exactly where the checkpoint left it; on a
different world size the rest of the epoch is re-planned (see
:mod:`datacentric.scheduling.resume`).

Where each part lives: one step (its micro-batches, clipping, the optimizer, the step's
record; :class:`NonFiniteLossError`) in :mod:`~datacentric.train.trainer_step`; the
resume, each save and what a stop signal says in :mod:`~datacentric.train.trainer_saves`.
Here: the run's setup, its loop over the steps and validation, its result and
:func:`train_rank`; every public name this module held before is still importable from it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from datacentric.parallel.groups import ProcessGroups, agree_max, device_memory_bytes
from datacentric.parallel.launch import launch_mode
from datacentric.progress import counted
from datacentric.schedule import Schedule
from datacentric.scheduling.resume import Position
from datacentric.settings import TrainConfig
from datacentric.settings.run_settings import record_toml, recorded_settings, save_record
from datacentric.train.assemble import Prechecked, assemble_run
from datacentric.train.build import what_trains
from datacentric.train.checkpoints.checkpoint_load import weights_sha256
from datacentric.train.checkpoints.preemption import StopSignals, signal_name
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints
from datacentric.train.checkpoints.run_saves import RunSaves
from datacentric.train.data_centric import Step
from datacentric.train.fault_injection import FaultInjection
from datacentric.train.hooks import StepHooks
from datacentric.train.lr_schedule import lr_scheduler, planned_total
from datacentric.train.rank_agreement import check_shared_run_folder
from datacentric.train.reporting.heartbeat import Heartbeat
from datacentric.train.reporting.metric_sinks import (
    MetricsLogger,
    logger,
    setup_logging,
    wandb_settings,
)
from datacentric.train.reporting.metrics import full_model_state
from datacentric.train.reporting.step_trace import StepTracer
from datacentric.train.run_folder import RunFolderLock, claim_run_folder, save_schedule
from datacentric.train.trainer_saves import TrainerSaves
from datacentric.train.trainer_step import NonFiniteLossError, TrainerStep
from datacentric.train.validation.driver import RunValidation
from datacentric.train.validation.held_out import write_held_out

#: every public name this module held before its parts moved (each the object of its home)
__all__ = [
    "NonFiniteLossError",
    "TrainResult",
    "Trainer",
    "steps_text",
    "train_rank",
    "train_rank_in_locked_folder",
]


@dataclass
class TrainResult:
    """What a rank's run did."""

    iterations_done: int
    samples_seen: int
    losses: list[float]
    tokens_per_s: list[float]
    weights_sha256: str
    out_dir: str
    stopped_by_signal: int | None = None
    """The signal (SIGTERM, SIGINT) the run stopped for after saving, else ``None``."""
    checkpoint: str | None = None
    """The last checkpoint this run saved (its folder name)."""
    loss_tokens: int = 0
    """Loss-carrying tokens the run trained on (under assistant-only loss, the
    assistant's tokens), from its first step: a resumed run counts the steps before
    its checkpoint too, as ``samples_seen`` does."""
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    """``(step, val_loss)`` of every validation this start ran (steps from 1)."""
    best_val_loss: float | None = None
    """The lowest validation loss of the run (a resumed run's earlier ones included)."""
    best_val_step: int | None = None
    """The step (from 1) that had it."""


@dataclass
class _Tally:
    """What the steps of a run add up to, for its :class:`TrainResult`."""

    losses: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    stopped_by: int | None = None


class Trainer(TrainerStep, TrainerSaves):
    """One rank's training run; construct on every rank (``groups``: its process groups;
    None: the assembly makes them from the ``[parallelism]`` section)."""

    def __init__(
        self,
        config: TrainConfig,
        groups: ProcessGroups | None = None,
        *,
        lock_folder: bool = True,
        hooks: StepHooks | None = None,
        prechecked: Prechecked | None = None,
    ) -> None:
        run = assemble_run(config, groups, prechecked)  # groups, data, model, ..., optimizer
        config, groups = run.config, run.groups  # as the run records it (its batch sized)
        self.config = config
        """The run's settings, kept only to write its files (as the folder records them:
        :attr:`settings_json`); each part gets its sections."""
        self.lock_folder = lock_folder
        """Rank 0 locks ``out`` (:class:`RunFolderLock`); off when the caller holds it."""
        self.hooks = hooks or StepHooks()
        """What runs at the run's events (:mod:`datacentric.train.hooks`)."""
        self.groups, self.out = groups, Path(config.job.out)
        self.is_main = groups.rank == 0
        self.activity = "setup"
        """What this rank is doing (published by the heartbeat; names it when it stalls)."""
        self._step_now: Step | None = None
        self.heartbeat = Heartbeat(groups, self._phase_now)
        self.dataset = run.dataset
        self.held_out = run.held_out
        """The ``[validation]`` section's held-out samples (None: no validation)."""
        self.shapes = self.dataset.shapes()
        self.dc = run.dc
        self.loss_tokens = self.dc.runtime.loss_tokens_of  # the rule the runtime weighs by
        if self.held_out is not None:  # its plan and schedule: a sample that cannot fit fails now
            self.dc.prepare_evaluation(self.held_out)
        self.validation = RunValidation.of(
            config.validation,
            config.data,
            config.job.seed,
            self.out,
            self.held_out,
            is_main=self.is_main,
            progress=config.metrics.progress,
        )
        """Validation's driver (what runs after a due step) and its record."""
        self.validation.check(self.dc.module, config.model.model)
        self.model = self.dc.model  # wrapped or sharded: the optimizer takes its parameters
        self.step_metrics = run.step_metrics
        self.optimizer = run.optimizer
        self.total_iterations = self.lr_horizon = 0
        """The steps this command plans (its last step), and those the learning-rate schedule
        spans: the same, or a resumed run's first horizon (``lr_horizon = "first"``)."""
        self.loss_tokens_seen = 0
        """Loss tokens of every step so far, those before a resumed checkpoint included
        (saved in its ``trainer.json``)."""
        # the last step after which the ranks agreed on the stop signals (one that comes
        # later is read after the next step), and whether they are agreeing now (one that
        # comes then counts if another rank read it in time, else after the next step)
        self._stop_read_after, self._stop_agreeing = -1, False
        self.training, self.job = config.training, config.job
        self.metrics_config, self.profiling = config.metrics, config.profiling
        self.checkpoints = RunCheckpoints(config.checkpoint, self.out, is_main=self.is_main)
        self.collective_timeout_s = config.parallelism.collective_timeout_s
        self.saves = RunSaves(
            self.checkpoints,
            self.heartbeat,
            groups.rank,
            self.collective_timeout_s,
            say=self._say,
            on_saved=self.hooks.saved,
        )
        """The run's saves (one at a time) and the newest checkpoint it keeps."""
        self.fault = FaultInjection.of(
            config.training.fault_inject, self.out, groups.rank, self.collective_timeout_s
        )
        self.settings_json = recorded_settings(self.config.to_json())
        """The settings as ``config.json`` holds them (checkpoints and W&B record them):
        without what its start did once (overwrite, resume_from, expect_sha256), so that
        ``--resume`` continues the run."""
        self.model_name = config.model.model
        self.tokenizer = config.data.tokenizer
        """What the run reads text with (chosen by ``assemble_run``; None: it reads none)."""
        self.bfloat16, self.policy = config.model.dtype == "bfloat16", config.scheduling.policy

    def _phase_now(self) -> str:
        step = self._step_now
        if step is not None and not step.finished:
            return f"step {step.number}: {step.phase}"
        return self.activity

    def _say(self, activity: str) -> None:
        self.activity = activity

    @property
    def saved(self) -> Path | None:
        """The last checkpoint this run saved (None: none yet)."""
        return self.saves.saved

    @property
    def position(self) -> Position:
        """Where the run stands (``DataCentric``'s position, saved in checkpoints)."""
        return self.dc.position

    def _planned_total(self) -> int:
        per_epoch = self.dc.current_length()  # known before the epoch's steps are built
        return planned_total(self.training, per_epoch, note=self.is_main)

    # ---------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train until ``training.iterations`` steps or ``training.epochs`` epochs are
        done, or until a SIGTERM/SIGINT (``save_on_signal``): then every rank stops after the
        same step and saves (see :mod:`datacentric.train.checkpoints.preemption`)."""
        lock = RunFolderLock(self.out) if self.is_main and self.lock_folder else None
        if lock is not None:
            lock.acquire()  # before anything in the folder is written
        try:
            check_shared_run_folder(self.groups, self.out)  # every rank sees rank 0's lock
            with self.heartbeat:
                if self.checkpoints.save_on_signal:
                    announce = self._stop_note if self.is_main else None
                    lost = self._lost_note if self.is_main else None
                    with StopSignals(announce, lost) as signals:
                        return self._run(signals)
                return self._run(None)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, signals: StopSignals | None) -> TrainResult:
        logs = self.metrics_config
        setup_logging(logs.log_level, self.groups.rank, logs.log_all_ranks)
        if self.is_main:
            restarted = launch_mode().restarts > 0
            claim_run_folder(self.job, self.checkpoints.checkpoint, restarted=restarted)
        self._resume()  # checks the checkpoint before anything in the folder changes
        if self.is_main:
            self._write_run_files()
        scheduler = lr_scheduler(
            self.optimizer,
            self.training,
            self.lr_horizon,
            self.position.iterations_done,
            self.hooks.lr_factor(self.lr_horizon),
        )
        self.scheduler = scheduler
        """The run's learning-rate schedule (set when the run starts)."""
        owed = self._validate_owed(signals)  # before metrics.jsonl is opened to append
        metrics, tracer = self._metrics_and_tracer()
        if owed is not None:
            metrics.log_validation(*owed)
        if self.is_main:
            logger.info(
                "training %s on %d rank(s) (%s), policy %s: %s; run folder %s",
                self.model_name,
                self.groups.world_size,
                self.groups.device.type,
                self.policy,
                steps_text(self.position.iterations_done, self.total_iterations),
                self.out,
            )
            logger.info("%s", what_trains(self.dc.module, self.tokenizer))
        self.saves.saved_at = time.monotonic()
        self.hooks.train_begin(self.position.iterations_done, self.total_iterations)
        try:
            tally = self._train_steps(signals, scheduler, metrics, tracer)
        except ValueError as err:  # a resumed schedule refused: what it saved is marked
            if self.dc.ran_unchecked is None:
                raise
            raise self.saves.refused(err, *self.dc.ran_unchecked) from err
        finally:
            tracer.close()
            metrics.close()
            self.dc.close()
        if tally.stopped_by is not None and self.is_main:
            logger.warning(
                "stopped by %s after step %d; saved %s; continue with --resume",
                signal_name(tally.stopped_by),
                self.position.iterations_done,
                self.saves.saved,
            )
        if self.is_main and logs.plots:
            from datacentric.train.reporting.run_plots import draw_run_plots

            draw_run_plots(self.out)
        self.hooks.train_end(self.position.iterations_done)
        return TrainResult(
            iterations_done=self.position.iterations_done,
            samples_seen=self.position.samples_seen,
            losses=tally.losses,
            tokens_per_s=tally.rates,
            weights_sha256=weights_sha256(full_model_state(self.model)),
            out_dir=str(self.out),
            stopped_by_signal=tally.stopped_by,
            checkpoint=self.saves.saved.name if self.saves.saved else None,
            loss_tokens=self.loss_tokens_seen,
            val_losses=list(self.validation.record.losses),
            best_val_loss=self.validation.record.best_loss,
            best_val_step=self.validation.record.best_step,
        )

    def _write_run_files(self) -> None:
        """The run folder's settings (``config.json``, ``config.toml``), plan and the
        samples a ``split=`` held out (``validation/held_out.jsonl``)."""
        self.out.mkdir(parents=True, exist_ok=True)
        save_record(self.settings_json, self.out / "config.json")  # a kept batch included
        (self.out / "config.toml").write_text(record_toml(self.settings_json), encoding="utf-8")
        plan = self.dc.pipeline.plan.to_json(self.dc.pipeline.cost_model)
        (self.out / "plan.json").write_text(json.dumps(plan, indent=1), encoding="utf-8")
        write_held_out(self.out, self.dataset, self.held_out)  # a split's held-out samples

    def _metrics_and_tracer(self) -> tuple[MetricsLogger, StepTracer]:
        """Where the step records go, and the tracer of the steps ``trace_steps`` names."""
        logs, profiling = self.metrics_config, self.profiling
        metrics = MetricsLogger(
            self.out,
            enabled=self.is_main,
            total=self.total_iterations,
            initial=self.position.iterations_done,
            progress=logs.progress,
            log_every=logs.log_every,
            tensorboard=logs.tensorboard,
            wandb=wandb_settings(logs, dict(self.settings_json)) if self.is_main else None,
            memory_capacity_bytes=device_memory_bytes(self.groups.device, self.groups.world_size),
        )
        tracer = StepTracer(
            self.out,
            profiling.trace_steps,
            rank=self.groups.rank,
            device=self.groups.device,
            enabled=self.is_main or profiling.trace_all_ranks,
            memory_snapshot=profiling.memory_snapshot,
            run_steps=range(self.position.iterations_done + 1, self.total_iterations + 1),
        )
        return metrics, tracer

    def _train_steps(
        self,
        signals: StopSignals | None,
        scheduler: torch.optim.lr_scheduler.LambdaLR,
        metrics: MetricsLogger,
        tracer: StepTracer,
    ) -> _Tally:
        """Every step of the run (each schedule saved once, checkpoints as configured),
        until the last one or an agreed stop signal; then one final checkpoint."""
        training = self.training
        tally = _Tally()
        epochs = training.epochs if training.iterations is None else None
        # a resumed run's checkpoint at its first step exists already
        checkpointed = self.position.iterations_done or None

        def save(schedule: Schedule, at_step: int | None) -> None:
            if self.is_main:  # each schedule that runs, once it is whole
                save_schedule(self.out, schedule, at_step)

        steps = self.dc.steps(epochs, iterations=training.iterations, on_schedule=save)
        for step in steps:
            tracer.begin(step.number + 1)
            record = self._step(step, scheduler)
            tracer.end(step.number + 1)
            samples = self._validate(step.number + 1, record, signals)
            tally.losses.append(record["loss"])
            tally.rates.append(record["tokens_per_s"])
            self.loss_tokens_seen += record["loss_tokens"]
            metrics.log(record)
            if samples:
                metrics.log_samples(step.number + 1, samples)
            control = self.hooks.step_end(record)
            # the rest of the epoch skipped (unless the step was its last); every rank
            # decides the same (the hooks see the same record)
            if control.end_epoch and self.dc.position.epoch == step.epoch:
                self.dc.position.next_epoch()
            self.saves.finish()  # a background save had this step to write its shards
            overdue = self.saves.overdue()
            self._stop_agreeing = True
            signum = (signals.signum or 0) if signals is not None else 0
            stop, overdue = agree_max(self.groups, signum, int(overdue))  # one all-reduce
            self._stop_read_after, self._stop_agreeing = self.position.iterations_done, False
            tally.stopped_by = stop or None
            due = self.checkpoints.due(self.position.iterations_done) or overdue or control.save
            if due and not stop:  # a stop saves synchronously below
                self._save(scheduler, background=self.checkpoints.background)
                checkpointed = self.position.iterations_done
            if tally.stopped_by is not None or control.stop:
                break
        if tally.stopped_by is not None:  # the grace period is short: no waiting for
            self.dc.stop_building()  # the epoch's schedule (its file is the resume's)
        steps.close()  # else the schedule still being built is saved (waited for) here
        if checkpointed != self.position.iterations_done:  # one final checkpoint
            self._save(scheduler)
        self.saves.finish()  # a background save of the last step completes here
        self._catch_up()  # keep_last, once a resumed schedule is checked
        return tally

    def _validate(
        self, number: int, record: dict[str, Any], signals: StopSignals | None
    ) -> list[dict[str, Any]]:
        """Validation after step ``number`` when it is due (on every rank; see
        :meth:`RunValidation.after_step`): its results into ``record``, the prompts'
        completions or renders returned; a stop signal ends the renders at once."""
        if not self.validation.due(number, self.total_iterations):
            return []
        self.activity = f"validation after step {number}"
        stop = (lambda: signals.signum is not None) if signals is not None else None
        autocast = self._autocast()
        samples = self.validation.after_step(self.dc, number, record, autocast=autocast, stop=stop)
        self.activity = f"training after step {number}"
        return samples

    def evaluate(self) -> float | None:
        """The held-out loss of the ``[validation]`` samples under the model as it is
        now (collective: call it on every rank; None: no validation set)."""
        if self.held_out is None:
            return None
        return self.dc.evaluate(self.held_out, autocast=self._autocast())


def steps_text(done: int, total: int) -> str:
    """The steps a run will take: ``10 steps``; resumed after step 6, ``steps 7-10 of 10
    (4 to run)``."""
    if done == 0:
        return counted(total, "step")
    if done >= total:
        return f"all {total} steps done already"
    return f"steps {done + 1}-{total} of {total} ({total - done} to run)"


def train_rank(
    config: TrainConfig,
    groups: ProcessGroups | None = None,
    *,
    prechecked: Prechecked | None = None,
) -> TrainResult:
    """Run one rank of a training job (inside ``launch.launch``: spawned, under
    torchrun, or alone); rank 0 locks the run folder. ``prechecked``: what the check
    before the ranks start found (:class:`~datacentric.train.assemble.Prechecked`);
    ``groups``: this rank's process groups (None: the run makes them from the
    ``[parallelism]`` section, the first step of
    :func:`~datacentric.train.assemble.assemble_run`)."""
    return Trainer(config, groups, prechecked=prechecked).run()


def train_rank_in_locked_folder(
    config: TrainConfig, prechecked: Prechecked | None = None
) -> TrainResult:
    """:func:`train_rank` for a launcher that holds the run folder's lock itself."""
    return Trainer(config, lock_folder=False, prechecked=prechecked).run()
