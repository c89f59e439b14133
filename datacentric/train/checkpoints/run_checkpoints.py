"""A run's ``[checkpoint]`` section at work: which checkpoint a start resumes from,
which steps are saved, and how (the trainer's resume and save policy).

:class:`RunCheckpoints` is built from the section and the run folder only; the trainer
asks it where to resume and whether a step is due, and keeps the collective parts (the
heartbeat, the timeout message) itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datacentric.progress import counted
from datacentric.settings.sections import CheckpointConfig
from datacentric.train.checkpoints.checkpoint_folders import (
    REFUSED_FILE,
    REFUSED_REASON,
    CheckpointError,
    checkpoint_step,
    is_refused,
    list_checkpoints,
    unfinished_saves,
)
from datacentric.train.checkpoints.checkpoint_save import PendingSave, _prune, start_checkpoint
from datacentric.train.checkpoints.checkpoint_verify import find_checkpoint, resolve_resume_from
from datacentric.train.reporting.metric_sinks import logger
from datacentric.train.run_folder import RUN_FILES


@dataclass
class RunCheckpoints:
    """The ``[checkpoint]`` section of the run whose folder is ``out``."""

    checkpoint: CheckpointConfig
    """The ``[checkpoint]`` section."""
    out: Path
    """The run folder (``[job] out``)."""
    is_main: bool = True
    """Rank 0: the one that says which checkpoint it fell back to."""

    def to_load(
        self, restarted: bool, verify: Callable[[Path, str | None], Any] | None = None
    ) -> Path | None:
        """The checkpoint this start loads (``None``: a fresh start): ``resume_from``,
        else with ``resume`` (or a torchrun restart) the newest complete one, checked
        against ``expect_sha256`` unless restarted; ``verify``: how a candidate is
        checked (:func:`~.checkpoint.find_checkpoint`'s; default every file)."""
        if self.checkpoint.resume_from:
            path = resolve_resume_from(self.out, self.checkpoint.resume_from)
            if is_refused(path) and self.is_main:  # named: used, and said
                logger.warning(
                    "note: --resume-from %s: %s (its %s); resuming from it as named",
                    path.name,
                    REFUSED_REASON,
                    REFUSED_FILE,
                )
            return path
        if not (self.checkpoint.resume or restarted):
            return None
        pin = self.expected_sha256(restarted)
        path, notice = find_checkpoint(self.out, pin, verify)
        if path is None and pin is not None:  # a pin of nothing must not start over
            raise CheckpointError(
                f"--expect-sha256: {self.out} holds no checkpoint to check it against; "
                "name the run folder that holds the pinned checkpoint (or drop --expect-sha256)"
            )
        if notice and self.is_main:
            logger.warning("note: %s", notice)
        if path is None and self.is_main and self.checkpoint.resume and not self._holds_run():
            logger.warning("note: --resume: %s holds no run yet: a new run, at step 1", self.out)
        elif path is None and self.is_main and self.checkpoint.resume:
            logger.warning(
                "note: --resume: %s holds no checkpoint (the run stopped before its first "
                "save; it saves %s); starting at step 1",
                self.out,
                self.interval_text(),
            )
        if self.is_main:
            self._note_cut_short(path)
        return path

    def _holds_run(self) -> bool:
        """A run has recorded something in the run folder (its steps, its checkpoints,
        its settings): the folder a first start creates and locks holds none of them."""
        return any((self.out / name).exists() for name in RUN_FILES)

    def _note_cut_short(self, path: Path | None) -> None:
        """Say so when the newest save was cut short (its ``step-N.tmp`` folder is all
        that is left of it): the run continues from an earlier step than it reached."""
        done = checkpoint_step(path) if path is not None else -1
        cut = [(step, tmp) for step, tmp in unfinished_saves(self.out) if step > done]
        if cut:
            then = f"resuming from {path.name}" if path is not None else "starting over"
            logger.warning(
                "note: the save of step %d was cut short (%s is incomplete and is not read); %s",
                *cut[-1],
                then,
            )

    def expected_sha256(self, restarted: bool) -> str | None:
        """The manifest digest the loaded checkpoint must have: the checkpoint the user
        named is pinned; a restart resumes this job's own."""
        return None if restarted else self.checkpoint.expect_sha256

    def due(self, iterations_done: int) -> bool:
        """Whether the step that brought the run to ``iterations_done`` is saved
        (``checkpoint_every``)."""
        every = self.checkpoint.checkpoint_every
        return bool(every) and iterations_done % every == 0

    def overdue(self, seconds_since_save: float) -> bool:
        """Whether ``checkpoint_every_minutes`` of wall time have passed since the run
        started or last saved (each rank's own clock: the trainer agrees on it)."""
        minutes = self.checkpoint.checkpoint_every_minutes
        return bool(minutes) and seconds_since_save >= 60.0 * minutes

    def interval_text(self) -> str:
        """``every 500 steps or 10 min``: how often the run saves (for messages)."""
        steps, minutes = self.checkpoint.checkpoint_every, self.checkpoint.checkpoint_every_minutes
        parts = [counted(steps, "step")] if steps else []
        parts += [f"{minutes:g} min"] if minutes else []
        return f"every {' or '.join(parts)}" if parts else "only at the end"

    @property
    def background(self) -> bool:
        """Periodic saves are written in the background (``async_save``)."""
        return self.checkpoint.async_save

    @property
    def save_on_signal(self) -> bool:
        """A SIGTERM/SIGINT stops the run after a save (``save_on_signal``)."""
        return self.checkpoint.save_on_signal

    def start(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict[str, Any],
        *,
        before_commit: Callable[[], None] | None = None,
        background: bool = False,
        best_step: int | None = None,
        keep_through: int | None = None,
    ) -> PendingSave:
        """Start saving ``step`` in the run folder, keeping ``keep_last`` checkpoints and,
        with ``keep_best``, the one of ``best_step`` (the best validation's), and every
        checkpoint of a step up to ``keep_through`` (collective; see
        :func:`~datacentric.train.checkpoints.checkpoint_save.start_checkpoint`)."""
        return start_checkpoint(
            self.out,
            step,
            model,
            optimizer,
            trainer_state,
            keep_last=self.checkpoint.keep_last,
            before_commit=before_commit,
            async_save=background,
            keep_steps=self.kept_steps(best_step, keep_through),
        )

    def kept_steps(self, best_step: int | None, keep_through: int | None = None) -> tuple:
        """The steps whose checkpoints ``keep_last`` does not prune: ``best_step`` with
        ``keep_best``, and those of the run folder's checkpoints up to ``keep_through``
        (the one a run resumed from, while its schedule is unchecked)."""
        kept = (best_step,) if self.checkpoint.keep_best and best_step is not None else ()
        if keep_through is None or self.checkpoint.keep_last is None:
            return kept
        steps = (checkpoint_step(p) for p in list_checkpoints(self.out))
        return kept + tuple(s for s in steps if s is not None and s <= keep_through)

    def prune(self, current: Path, best_step: int | None) -> None:
        """Delete what ``keep_last`` keeps no longer, as the save of ``current`` (the
        newest checkpoint) did where it kept more (``keep_through``; rank 0)."""
        if self.is_main and self.checkpoint.keep_last is not None:
            _prune(self.out, current, self.checkpoint.keep_last, self.kept_steps(best_step))
