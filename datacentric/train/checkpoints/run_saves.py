"""A running trainer's saves: one at a time, written in the background or not, each
phase named by the heartbeat (a save that stalls on a peer names the peers), and what a
stop without a save keeps and loses.

:class:`RunSaves` is built by the trainer beside its :class:`RunCheckpoints` (which says
when a step is due) and keeps the newest checkpoint the run saved or resumed from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from datacentric.train.checkpoints.checkpoint_folders import (
    REFUSED_FILE,
    checkpoint_step,
    named_checkpoints,
)
from datacentric.train.checkpoints.checkpoint_save import PendingSave, _write_atomic
from datacentric.train.checkpoints.checkpoint_verify import manifest_sha256
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints
from datacentric.train.reporting.heartbeat import Heartbeat, is_timeout
from datacentric.train.reporting.metric_sinks import logger


@dataclass
class RunSaves:
    """The saves of rank ``rank``'s run (collective: every rank saves each step)."""

    checkpoints: RunCheckpoints
    """The ``[checkpoint]`` section at work (where, what to keep, how)."""
    heartbeat: Heartbeat
    """Published before each phase of a save; read when a collective times out."""
    rank: int
    collective_timeout_s: float
    """The ``[parallelism]`` section's timeout (named when a save times out)."""
    say: Callable[[str], None]
    """Sets what this rank is doing (the heartbeat publishes it)."""
    on_saved: Callable[[int, Path], None]
    """Called with the step and the folder of each completed checkpoint."""
    saved: Path | None = None
    """The last checkpoint this run saved."""
    kept: Path | None = None
    """The newest complete checkpoint of the run folder (saved or resumed from): what a
    stop without a save leaves to resume from."""
    saved_at: float = field(default_factory=time.monotonic)
    """When the run started or last saved (``checkpoint_every_minutes`` counts from it)."""
    pending: PendingSave | None = None
    """A background save (``async_save``) not yet complete: no manifest, not ``latest``."""
    written: list[Path] = field(default_factory=list)
    """Every checkpoint this run saved, oldest first."""
    resumed: Path | None = None
    """The checkpoint the run resumed from (``None``: a fresh start)."""
    held: bool = False
    """A save kept the checkpoints up to :attr:`resumed` past ``keep_last``, the resumed
    schedule unchecked then (:meth:`catch_up` prunes them once it is checked)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def overdue(self) -> bool:
        """``checkpoint_every_minutes`` have passed since the last save (or the start)."""
        return self.checkpoints.overdue(time.monotonic() - self.saved_at)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict[str, Any],
        *,
        before_commit: Callable[[], None] | None = None,
        best_step: int | None = None,
        background: bool = False,
        unchecked: bool = False,
    ) -> None:
        """Save ``step`` (collective); ``background``: return once the state is staged,
        the save completing after the next step (:meth:`finish`) or at the run's end;
        ``unchecked``: the resumed schedule may still be refused, so ``keep_last`` prunes
        no checkpoint up to the one resumed from (the state to go back to)."""
        self.finish()  # one save at a time: the previous one completes first
        through = checkpoint_step(self.resumed) if unchecked and self.resumed else None
        self.held = self.held or through is not None
        self.pending = self._in_save(
            step,
            lambda: self.checkpoints.start(
                step,
                model,
                optimizer,
                trainer_state,
                before_commit=before_commit,
                background=background,
                best_step=best_step,
                keep_through=through,
            ),
        )
        if not background:
            self.finish()

    def finish(self) -> None:
        """Complete the pending save: its manifest, its folder's name, ``latest``."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        self.saved = self.kept = self._in_save(pending.step, pending.wait)
        self.written.append(self.saved)
        self.saved_at = time.monotonic()
        if self.is_main:
            logger.info("saved %s (manifest sha256 %s)", self.saved, manifest_sha256(self.saved))
        self.on_saved(pending.step, self.saved)

    def catch_up(self, best_step: int | None) -> None:
        """Once the resumed schedule is checked equal: prune what the saves since the
        resume kept past ``keep_last`` (rank 0; ``best_step``: kept with ``keep_best``)."""
        if self.held and self.saved is not None and self.pending is None:
            self.checkpoints.prune(self.saved, best_step)
            self.held = False

    def refused(self, err: ValueError, first: int, last: int) -> ValueError:
        """The refusal ``err`` of a resumed epoch's rebuilt schedule, found to differ once
        its steps ``first``..``last`` had run on it, saying which of this run's
        checkpoints hold those steps: each is marked so (rank 0 writes :data:`REFUSED_FILE`
        into it; nothing is deleted) and ``--resume`` passes over it."""
        marked = [
            p for p in self.written if first <= (checkpoint_step(p) or 0) <= last and p.is_dir()
        ]
        if not marked:
            return err
        if self.is_main:
            record = {"steps": [first, last], "refusal": str(err)}
            for path in marked:
                _write_atomic(path / REFUSED_FILE, json.dumps(record, indent=1) + "\n")
        names = named_checkpoints([p.name for p in marked])
        return ValueError(
            f"{err}; saved after those steps: {names}, each now marked {REFUSED_FILE}, "
            "which --resume passes over"
        )

    def _in_save(self, step: int, phase: Callable[[], Any]) -> Any:
        """Run a phase of a save (collective) with the heartbeat naming it; a collective
        timeout names the peers."""
        self.say(f"checkpoint save (step {step})")
        self.heartbeat.publish()  # before the save can stall: a peer reads this phase
        try:
            return phase()
        except (Exception, CheckpointException) as err:
            if not is_timeout(err):
                raise
            peers = self.heartbeat.describe_peers() or "a peer rank stopped answering?"
            raise RuntimeError(
                f"rank {self.rank}: checkpoint save (step {step}) timed out after "
                f"{self.collective_timeout_s:g} s: {peers}"
            ) from err
        finally:
            self.say(f"training after step {step}")

    def lost_note(self, reached: int) -> str:
        """What a stop without a save keeps and loses when the run has reached step
        ``reached`` (said from the signal handler)."""
        kept = (checkpoint_step(self.kept) or 0) if self.kept is not None else 0
        if reached <= kept:
            lost = "no step is lost"
        elif reached == kept + 1:
            lost = f"step {reached} is lost"
        else:
            lost = f"steps {kept + 1}-{reached} are lost"
        if self.kept is None:
            every = self.checkpoints.interval_text()
            return f"no checkpoint was saved yet ({lost}; the run saves {every})"
        return f"{self.kept} is kept ({lost}); continue from it with --resume"
