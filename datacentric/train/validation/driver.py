"""Validation's driver beside the run loop: when a run validates, what it runs then
(the held-out loss, the prompts' completions, the pipeline's renders) and what it found.

- :class:`ValidationRecord`: when validation is due (``every``, and after the last
  step), the best step so far and its record in the run folder
  (``validation/best.json``);
- :class:`RunValidation`: what the ``[validation]`` section asks for, built from it in
  one place (:meth:`RunValidation.of`); after a due step, on every rank, the held-out
  loss into the step's record, then the prompts' completions or renders (rank 0 writes
  them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from datacentric.data.base import Dataset
from datacentric.data.prompts import read_prompts
from datacentric.data.tokenizer_files import TextCodec
from datacentric.settings.sections import DataConfig, ValidationConfig
from datacentric.train.validation.prompts import PromptSamples, write_samples
from datacentric.train.validation.renders import PipelineSamples

#: The run folder's record of the best validation step.
BEST_FILE = Path("validation") / "best.json"


@dataclass
class ValidationRecord:
    """When a run validates and what it found: ``every`` steps (None: after the last
    only; 0: never) and after the last step; the best (lowest) loss and its step."""

    every: int | None
    out: Path
    best_loss: float | None = None
    best_step: int | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    """``(step, val_loss)`` of every validation this start ran (steps from 1)."""

    def due(self, step: int, last: int) -> bool:
        """Whether validation runs after step ``step`` (from 1) of a run of ``last``."""
        if self.every == 0:
            return False
        return step == last or bool(self.every) and step % self.every == 0

    def load(self, records: list[dict[str, Any]], *, write: bool) -> None:
        """The best step of a resumed run's earlier validations (its ``metrics.jsonl``
        records up to the checkpoint); ``write``: rank 0 rewrites the folder's record."""
        self.best_loss = self.best_step = None
        if write:
            (self.out / BEST_FILE).unlink(missing_ok=True)
        for record in records:
            if record.get("val_loss") is not None:
                self._better(record["iteration"] + 1, float(record["val_loss"]), write=write)

    def add(self, step: int, loss: float, *, write: bool) -> bool:
        """Record the loss of ``step``; True when it is the best so far (``write``: rank
        0 writes ``validation/best.json``)."""
        self.losses.append((step, loss))
        return self._better(step, loss, write=write)

    def _better(self, step: int, loss: float, *, write: bool) -> bool:
        if self.best_loss is not None and not loss < self.best_loss:
            return False
        self.best_loss, self.best_step = loss, step
        if write:
            path = self.out / BEST_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps({"step": step, "val_loss": loss}) + "\n", encoding="utf-8")
            tmp.replace(path)
        return True


@dataclass
class RunValidation:
    """What a run validates with (the ``[validation]`` section's held-out set, prompts or
    renders) and its record; :meth:`after_step` runs what is due."""

    record: ValidationRecord
    held_out: Dataset | None
    """The held-out samples (None: no held-out loss)."""
    prompts: PromptSamples | None
    """The prompts to continue (None: no ``prompts`` file, or a ``pipeline`` renders them)."""
    renders: PipelineSamples | None
    """The prompts rendered through the section's ``pipeline`` (None: none)."""
    out: Path
    is_main: bool
    """Rank 0: writes the records and shows the progress."""
    progress: bool = False
    """Show the held-out passes' progress (``[metrics] progress``)."""

    @classmethod
    def of(
        cls,
        validation: ValidationConfig,
        data: DataConfig,
        seed: int,
        out: Path,
        held_out: Dataset | None,
        *,
        is_main: bool,
        progress: bool = False,
    ) -> RunValidation:
        """The ``[validation]`` section's validation of the run in folder ``out``, built
        in one place: the ``held_out`` samples (opened with the training set), and the
        section's ``prompts``, rendered through its ``pipeline`` when it names one (a
        diffusers model: :meth:`PipelineSamples.of`), else continued by the text model
        as the ``[data]`` section's tokenizer reads them."""
        renders = PipelineSamples.of(validation, seed, out)
        prompts = None
        if renders is None and validation.prompts is not None:
            prompts = PromptSamples(
                read_prompts(validation.prompts),
                TextCodec(data.tokenizer),  # as the text datasets read the tokenizer
                validation.max_new_tokens,
                validation.temperature,
                seed,
            )
        record = ValidationRecord(validation.every, out)
        return cls(record, held_out, prompts, renders, out, is_main, progress)

    def check(self, module: Any, model: str) -> None:
        """Refuse a ``module`` (the model ``model`` names) that cannot run the section's
        renders or continue its prompts (``ValueError`` naming the setting)."""
        if self.renders is not None:
            self.renders.check(module)
        if self.prompts is not None:
            self.prompts.check(module, model)

    def due(self, step: int, last: int) -> bool:
        """Something validates after step ``step`` (from 1) of a run of ``last``."""
        if self.held_out is None and self.prompts is None and self.renders is None:
            return False
        return self.record.due(step, last)

    def owed(self, step: int, last: int, *, has_loss: bool) -> tuple[bool, bool]:
        """What a stop left undone of the validation after step ``step`` (from 1) of a
        run of ``last``, as rank 0 finds it in the run folder: the held-out loss
        (``has_loss``: the step's record holds its ``val_loss``) and the prompts'
        completions (``validation/step-N.jsonl`` missing or short) or renders (a
        prompt's file or the contact sheet missing from ``validation/step-N/``)."""
        if not self.due(step, last):
            return False, False
        loss = self.held_out is not None and not has_loss
        prompts = self.prompts is not None and not self.prompts.written(self.out, step)
        renders = self.renders is not None and not self.renders.written(step)
        return loss, prompts or renders

    def only(self, loss: bool, prompts: bool) -> RunValidation:
        """This validation with only the parts :meth:`owed` names: the held-out loss
        when ``loss``, the prompts' completions or renders when ``prompts``; the same
        record."""
        return replace(
            self,
            held_out=self.held_out if loss else None,
            renders=self.renders if prompts else None,
            prompts=self.prompts if prompts else None,
        )

    def after_step(
        self,
        dc: Any,
        step: int,
        record: dict[str, Any],
        *,
        autocast: AbstractContextManager,
        stop: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Validation after step ``step`` under ``dc``'s model (a :class:`DataCentric`;
        collective: every rank calls it): the held-out loss into the step ``record``
        (``val_loss``, and ``val_time_s`` apart from its step time), and the prompts'
        completions (rank 0 writes ``validation/step-N.jsonl``) or renders
        (``validation/step-N/``), which it returns; ``stop()`` True (a stop signal) ends
        the held-out loss before its next batch (no ``val_loss`` for the step), the
        completions before their next token (:meth:`PromptSamples.run`) and the renders
        at once (:meth:`PipelineSamples.run`): what finished is kept."""
        started = time.perf_counter()
        if self.held_out is not None:
            shown = self.is_main and self.progress
            loss = dc.evaluate(self.held_out, autocast=autocast, progress=shown, stop=stop)
            if loss is not None:  # None: stopped before its last batch
                self.record.add(step, loss, write=self.is_main)
                record["val_loss"] = loss
        samples = []
        if self.prompts is not None:
            samples = self.prompts.run(dc, step, autocast=autocast, stop=stop)
            if self.is_main and samples:  # none: stopped before its first prompt finished
                write_samples(self.out, step, samples)
        if self.renders is not None:
            samples = self.renders.run(dc, step, autocast=autocast, stop=stop)
        record["val_time_s"] = time.perf_counter() - started
        return samples
