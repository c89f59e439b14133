"""Where a run stands in its data, and the schedule that continues from there.

An epoch is run in *segments*: a segment is one schedule built for one world size
over the samples the epoch had not run when the segment began. A run that never
changes world size has one segment per epoch. Resuming on a different number of
ranks ends the segment and plans the remaining samples for the new world, so every
sample still runs exactly once per epoch.

The schedule of a segment is a pure function of (shapes, policy, world size, cost
model, seed, epoch, excluded samples), so the position needs only those numbers
and ids; a fingerprint of the rebuilt schedule guards against a changed dataset
or cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from datacentric.schedule import Schedule
from datacentric.scheduling.resume import schedule_fingerprint


@dataclass
class Position:
    """A run's progress; JSON-able, stored in every checkpoint."""

    epoch: int = 0
    iterations_done: int = 0
    """Optimizer steps since the run's start (across epochs and restarts)."""
    samples_seen: int = 0
    """Samples trained since the run's start."""
    segment_world: int | None = None
    """World size the current segment's schedule was built for (None: no segment yet)."""
    segment_excluded: list[int] = field(default_factory=list)
    """Sample ids the epoch had already run when the segment began."""
    segment_iteration: int = 0
    """Next iteration of the current segment's schedule."""
    segment_fingerprint: str = ""
    """Fingerprint of the segment's schedule (checked when it is rebuilt)."""
    consumed: list[int] = field(default_factory=list)
    """Sample ids of this epoch that have run (in order)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Position:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def segment_schedule(
    position: Position,
    num_samples: int,
    world_size: int,
    make_schedule: Callable[[int, Sequence[int] | None], Schedule],
) -> Schedule:
    """The schedule that continues from ``position`` on ``world_size`` ranks.

    ``make_schedule(epoch, sample_ids)`` builds an epoch's schedule (restricted to
    ``sample_ids`` unless ``None``). Updates ``position`` when a new segment starts
    (new epoch, or a world size other than the saved segment's: then the remaining
    samples are re-planned for the new world).
    """
    if position.segment_world != world_size:
        position.segment_excluded = sorted(position.consumed)
        position.segment_iteration = 0
        position.segment_world = world_size
        position.segment_fingerprint = ""
    excluded = set(position.segment_excluded)
    sample_ids = None if not excluded else [i for i in range(num_samples) if i not in excluded]
    if sample_ids is not None and not sample_ids:
        raise ValueError(f"epoch {position.epoch} has no samples left to run")
    schedule = make_schedule(position.epoch, sample_ids)
    fingerprint = schedule_fingerprint(schedule)
    if position.segment_fingerprint and position.segment_fingerprint != fingerprint:
        raise ValueError(
            f"the rebuilt schedule of epoch {position.epoch} (world {world_size}, policy "
            f"{schedule.policy}) differs from the checkpoint's: the dataset, model, cost model "
            "or options changed since it was saved; resume with the same settings"
        )
    position.segment_fingerprint = fingerprint
    return schedule


def next_epoch(position: Position) -> None:
    """Move ``position`` to the start of the next epoch."""
    position.epoch += 1
    position.consumed = []
    position.segment_excluded = []
    position.segment_iteration = 0
    position.segment_world = None
    position.segment_fingerprint = ""
