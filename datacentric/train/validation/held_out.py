"""The held-out samples of a run, their schedule and their loss.

- the ``[data]`` and ``[validation]`` sections' datasets are opened in one place of
  ``data/`` (:func:`~datacentric.data.sources.build_run_data`: the training set without
  the held-out samples, ``split=FRACTION`` a seeded draw of
  :mod:`datacentric.data.holdout`, and the held-out set, or another dataset read with
  the same ``[data]`` settings); :func:`write_held_out` records a split's held-out
  samples in the run folder;
- :class:`HeldOut`: a held-out set planned and scheduled once with the run's budget,
  policy and SP sizes, its passes priced as what they run, forward only
  (:class:`~datacentric.planning.forward_only.ForwardOnlyCostModel` over the run's
  cost model: no backward, no recomputation, no activation kept for one), so its plan
  may hold more tokens per GPU than training's; every sample in it exactly once;
- :func:`validation_loss`: that schedule run forward only on every rank
  (:func:`~datacentric.parallel.evaluate.evaluate_schedule`), each sample weighted
  as in training, the whole set at once: the loss a single process computes on it.
  Diffusion noise and time are drawn for epoch 0 of each held-out sample, from the
  seed and its sample id only, so the number moves only when the model does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from datacentric.data.base import DataError, Dataset, epoch_pack
from datacentric.data.documents import resolve_files
from datacentric.data.holdout import held_out_records
from datacentric.data.sources import build_run_data as build_run_data  # its old home
from datacentric.parallel.evaluate import evaluate_schedule
from datacentric.parallel.loss import LossWeights, loss_tokens_function
from datacentric.planning.forward_only import ForwardOnlyCostModel
from datacentric.progress import Progress
from datacentric.schedule import Schedule
from datacentric.scheduling.global_batches import held_out_batch
from datacentric.scheduling.pipeline import Pipeline
from datacentric.settings.sections import (
    DataConfig,
    ValidationConfig,
    split_fraction,
)

#: The run folder's record of the samples a ``split=`` held out of training.
HELD_OUT_FILE = Path("validation") / "held_out.jsonl"


def training_set_note(data: DataConfig, validation: ValidationConfig) -> str | None:
    """A note when the ``[validation]`` dataset is the training set itself (the same
    object, source or files): its loss then measures fit, not generalisation. The run
    goes on; ``None`` for a split or another dataset."""
    held, trained = validation.dataset, data.dataset
    if held is None or split_fraction(held) is not None:
        return None
    if isinstance(held, str) and isinstance(trained, str):
        same = _same_source(held, trained)
    else:
        same = held is trained
    if not same:
        return None
    return (
        f"validation.dataset {held if isinstance(held, str) else 'object'} is the training "
        "set itself: its loss measures fit, not generalisation (hold samples out with "
        "--validation.dataset split=0.1, or name another dataset)"
    )


def _same_source(a: str, b: str) -> bool:
    """Two dataset sources read the same data: the same string, or the same kind and
    files (paths resolved, links followed)."""
    if a == b:
        return True
    (kind_a, _, rest_a), (kind_b, _, rest_b) = a.partition(":"), b.partition(":")
    if kind_a != kind_b or not rest_a or not rest_b:
        return False
    try:
        files_a, files_b = resolve_files(kind_a, rest_a), resolve_files(kind_b, rest_b)
    except DataError:
        files_a, files_b = [rest_a], [rest_b]
    return {os.path.realpath(f) for f in files_a} == {os.path.realpath(f) for f in files_b}


def write_held_out(out: Path, training: Dataset, held_out: Dataset | None) -> None:
    """Write ``validation/held_out.jsonl`` into the run folder ``out`` when ``held_out``
    is a ``split=`` of the training set: one JSON line per sample never trained on
    (:func:`~datacentric.data.holdout.held_out_records`: id, source file, validated)."""
    records = held_out_records(training, held_out)
    if records is None:
        return
    path = out / HELD_OUT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    tmp.write_text(lines, encoding="utf-8")
    tmp.replace(path)


class HeldOut:
    """A held-out ``dataset`` planned and scheduled once beside a run's ``pipeline``
    (its budget, policy, seed and SP sizes, its cost model priced forward only; every
    sample kept), cut by the run's global batch raised where it does not cover the
    held-out samples (:func:`~datacentric.scheduling.global_batches.held_out_batch`)."""

    def __init__(self, dataset: Dataset, pipeline: Pipeline) -> None:
        self.dataset = dataset
        options = held_out_batch(
            pipeline.options,
            [shape.tokens for shape in dataset.shapes()],
            world_size=pipeline.world_size,
            largest_sp=max(pipeline.sp_sizes, default=1) if pipeline.sp_sizes else None,
        )
        self.pipeline = Pipeline(
            dataset.shapes(),
            ForwardOnlyCostModel(pipeline.cost_model),
            world_size=pipeline.world_size,
            memory_cap_bytes=pipeline.memory_cap_bytes,
            policy=pipeline.policy,
            options=options,
            seed=pipeline.seed,
            sp_sizes=pipeline.sp_sizes,
        )
        self._schedule: Schedule | None = None
        self._loss_tokens = loss_tokens_function(dataset)

    @property
    def schedule(self) -> Schedule:
        """The held-out set's schedule (made once; raises ``ValueError`` when it leaves a
        sample out or holds one twice)."""
        if self._schedule is None:
            schedule = self.pipeline.schedule(0, measure=False)
            ids = sorted(i for it in schedule.iterations for i in it.sample_ids())
            if ids != list(range(len(self.dataset))):
                raise ValueError(
                    f"the validation schedule holds {len(ids)} of the {len(self.dataset)} "
                    "held-out samples once each; every sample must be in it exactly once"
                )
            self._schedule = schedule
        return self._schedule

    def weights(self, loss_mode: str) -> LossWeights:
        """Each held-out token's weight: the whole set weighted as one training batch."""
        ids = range(len(self.dataset))
        return LossWeights.for_samples(loss_mode, ids, self._loss_tokens)  # type: ignore[arg-type]


def validation_loss(
    dc: Any,
    held_out: HeldOut,
    *,
    autocast: AbstractContextManager | None = None,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
) -> float | None:
    """The held-out loss of ``held_out`` under ``dc``'s model (a :class:`DataCentric`;
    collective: every rank calls it); ``progress`` shows ``progress: validation K/N``
    lines (rank 0); ``None`` once ``stop()`` (agreed by the ranks before each batch)
    ended it."""
    iterations = held_out.schedule.iterations
    with Progress("validation", len(iterations), unit="batch", enabled=progress) as shown:
        return evaluate_schedule(
            dc.runtime,
            iterations,
            epoch_pack(held_out.dataset, 0),
            held_out.weights(dc.runtime.loss_mode),
            autocast=autocast,
            on_iteration=lambda _: shown.update(1),
            stop=stop,
        )
