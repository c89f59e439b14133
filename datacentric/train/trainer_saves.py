"""Where the trainer's run starts and how it stops
(:class:`~datacentric.train.trainer.Trainer`): resuming from the checkpoint found (or a
fresh start), what a stop signal will do and what a stop without a save loses (said from
the signal handler), and each save of a step: the position, the trainer's state, the fault
injected inside a save. :class:`TrainerSaves` is a base of the trainer: its methods read
what ``Trainer.__init__`` sets.
"""

from __future__ import annotations

from typing import Any

from datacentric.parallel.groups import agree_max
from datacentric.scheduling.resume import Position, batch_tokens_to_record, kept_global_batch
from datacentric.settings.run_settings import recorded_settings
from datacentric.train.checkpoints.preemption import StopSignals
from datacentric.train.checkpoints.resume import (
    BATCH_RECORD,
    add_to_record,
    check_kept_batch,
    dataset_fingerprint,
    keep_records_below,
    load_to_resume,
    step_validated,
    trainer_state,
)
from datacentric.train.reporting.metric_sinks import logger
from datacentric.train.reporting.metrics import read_jsonl


class TrainerSaves:
    """The trainer's resume, saves and stop notes (a base of
    :class:`~datacentric.train.trainer.Trainer`)."""

    def _resume(self) -> None:
        found = load_to_resume(
            self.checkpoints,
            self.model,
            self.optimizer,
            settings=self.settings_json,
            shapes=self.shapes,
        )
        if found is not None:  # before the epoch's length is asked for
            self._keep_global_batch(found[1])
        planned = self._planned_total()
        self.total_iterations = self.lr_horizon = planned
        if found is None:
            if self.is_main:  # a fresh start: records of an earlier attempt go
                keep_records_below(self.out, 0)
            return
        path, state = found
        self.dc.load_state_dict(state["position"])
        self.saves.kept = self.saves.resumed = path
        self.loss_tokens_seen = int(state.get("loss_tokens_seen", 0))
        done = self.position.iterations_done
        was = int(state["total_iterations"])  # the learning-rate horizon it saved
        self.lr_horizon = was if self.training.lr_horizon == "first" else planned
        if self.is_main:
            new = self.lr_horizon
            change = f" (the checkpoint's run planned {was})" if was != new else ""
            logger.info(
                "resuming from %s at step %d; learning-rate horizon %d steps%s",
                path.name,
                done,
                self.lr_horizon,
                change,
            )
            keep_records_below(self.out, done)
            self.validation.record.load(read_jsonl(self.out / "metrics.jsonl"), write=True)

    def _keep_global_batch(self, state: dict[str, Any]) -> None:
        """Cut the epochs by the global batch the resumed checkpoint recorded (its trainer
        state ``state``) where the settings give none, saying so
        (:func:`~datacentric.scheduling.resume.kept_global_batch`): a run given no batch
        keeps the default it trained on another world. ``train`` puts it in the settings
        before the ranks start (``global_batch_to_train``); this keeps it for a trainer
        started without that check, and checks it on this world as that check does
        (:func:`~datacentric.train.checkpoints.resume.check_kept_batch`: a step with too
        few samples for this world's groups is refused now, in one line)."""
        pipeline, world = self.dc.pipeline, self.groups.world_size
        options = pipeline.options
        recorded = state.get(BATCH_RECORD)
        kept = kept_global_batch(options, recorded, self.shapes, world)
        if kept is None:
            return
        sp_sizes = pipeline.sp_sizes or [world]  # the plan's (None: any size, the whole world)
        where = (self.shapes, sp_sizes, world, state.get("world_size"))
        check_kept_batch(kept, options, self.training, self.job.seed, *where)
        pipeline.options = kept.applied(options)
        # the run records the batch it trains (config.toml, its checkpoints' settings),
        # as train's check puts it in the settings
        if kept.tokens is not None:  # its settings files and checkpoints say it
            trained = self.config.updated(scheduling={"global_batch_tokens": kept.tokens})
            self.settings_json = recorded_settings(trained.to_json())
        if kept.note and self.is_main:
            logger.info("note: %s", kept.note)

    def _validate_owed(
        self, signals: StopSignals | None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The validation a stop signal cut short at the step a resumed run continues
        from (the signal came during the step or its validation: the step was saved
        without its ``val_loss``, or without every prompt's completion or render), run
        first, under that checkpoint's model, as the uninterrupted run ran it (only the
        parts left undone, :meth:`~datacentric.train.validation.driver.RunValidation.owed`):
        its held-out loss goes into the step's ``metrics.jsonl`` line (rank 0); the
        record and the prompts' completions or renders, None when none is owed.
        Collective (rank 0 decides from the folder's records; one all-reduce)."""
        done = self.position.iterations_done
        loss = prompts = False
        if self.is_main and self.saves.resumed is not None:
            has_loss = step_validated(self.out, done - 1)
            loss, prompts = self.validation.owed(done, self.total_iterations, has_loss=has_loss)
        loss, prompts = agree_max(self.groups, int(loss), int(prompts))
        if not (loss or prompts):
            return None
        record: dict[str, Any] = {"iteration": done - 1}
        validation, self.validation = self.validation, self.validation.only(loss, prompts)
        try:
            samples = self._validate(done, record, signals)
        finally:
            self.validation = validation
        if self.is_main and record.get("val_loss") is not None:
            add_to_record(self.out, done - 1, {k: record[k] for k in ("val_loss", "val_time_s")})
        return record, samples

    def _stop_note(self, signum: int) -> str:
        """What a stop signal does now (said at once, from the signal handler)."""
        step = self._step_now
        if step is not None and not step.finished:
            return f"finishing step {step.number + 1}, then saving"
        if not self.total_iterations:  # a stop before the checkpoint is read: steps unknown
            return "stopping after the next step, then saving"
        done = self.position.iterations_done
        after = f"{done}"
        if done < self.total_iterations:  # a next step runs unless this one's agreement stops
            if step is None or self._stop_read_after == done:
                after = f"{done + 1}"
            elif self._stop_agreeing:
                after = f"{done} or {done + 1}"
        return f"stopping after step {after}, then saving"

    def _lost_note(self) -> str:
        """What a stop without a save keeps and loses (said from the signal handler)."""
        step = self._step_now
        running = step is not None and not step.finished
        return self.saves.lost_note(step.number + 1 if running else self.position.iterations_done)

    def _save(self, scheduler, *, background: bool = False) -> None:
        """Save this step (collective; :meth:`RunSaves.save`). The position is
        ``DataCentric.state_dict()``'s: the schedule of an epoch begun in this run still
        being built is waited for (its fingerprint), unless a stop signal cancelled its
        build (``DataCentric.stop_building``: the fingerprint of its steps built); a
        resumed segment's is not, its saved record carried forward until it is checked."""
        position = Position.from_json(self.dc.state_dict())
        self.saves.save(
            position.iterations_done,
            self.model,
            self.optimizer,
            trainer_state(
                position,
                loss_tokens_seen=self.loss_tokens_seen,
                world_size=self.groups.world_size,
                total_iterations=self.lr_horizon,  # what lr_horizon = "first" keeps
                lr_state=scheduler.state_dict(),
                settings=self.settings_json,
                fingerprint=dataset_fingerprint(self.shapes),
                global_batch_tokens=batch_tokens_to_record(
                    self.dc.pipeline.options, self.shapes, self.groups.world_size
                ),
            ),
            before_commit=self._maybe_stop_in_save,
            best_step=self.validation.record.best_step,
            background=background,
            unchecked=self.dc.resume_unchecked,
        )

    def _catch_up(self) -> None:
        """Prune what saves kept past ``keep_last`` while the resumed schedule was
        unchecked, now that it is checked equal (nothing while it may still be refused)."""
        if not self.dc.resume_unchecked:
            self.saves.catch_up(self.validation.record.best_step)

    def _maybe_stop_in_save(self) -> None:
        """Fault injection ``RANK:STEP:stop``: SIGSTOP this rank inside the checkpoint save
        of step STEP, after its files are written (once per run folder)."""
        if self.fault is not None:
            self.fault.in_save(self.position.iterations_done)
