"""The one timing record: a :class:`Span` of one rank's time in one iteration.

Both executors of a :class:`~datacentric.schedule.Schedule` describe what they did
with spans: the runtime measures them (``IterationStats.spans``), the simulator
models them (``SimResult.spans``). The trace writer, the plots and the measured
comparison read nothing else.

A span belongs to the micro-batch it served, named by :func:`micro_batch_id`
(never by its position in a list). Kinds:

- ``compute``, ``recompute``, ``comm``: parts of a micro-batch's pass (the measured
  runtime cannot split a pass and reports it whole as ``compute``; the simulator
  splits it into compute, then the recomputation, then the all-to-all);
- ``sync``: the iteration's gradient reduction (no micro-batch);
- ``idle``: time a rank waits with nothing to run (no micro-batch; gaps between
  spans are idle too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule

COMPUTE = "compute"
RECOMPUTE = "recompute"
COMM = "comm"
SYNC = "sync"
IDLE = "idle"
#: kinds that are part of a micro-batch's pass
PASS_KINDS = (COMPUTE, RECOMPUTE, COMM)
KINDS = (*PASS_KINDS, SYNC, IDLE)


@dataclass(frozen=True, slots=True)
class Span:
    """``duration_s`` seconds of ``rank``'s time in ``iteration``, from ``start_s``.

    ``start_s`` is relative to a clock the producer states (the runtime: the start
    of the iteration on that rank; the simulator and comparisons: the start of the
    epoch). ``micro_batch`` is the :func:`micro_batch_id` of the pass the span is
    part of, ``None`` for ``sync`` and ``idle``.
    """

    rank: int
    iteration: int
    kind: str
    start_s: float
    duration_s: float
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"span kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if (self.micro_batch is None) == (self.kind in PASS_KINDS):
            raise ValueError(
                f"a {self.kind!r} span {'needs' if self.kind in PASS_KINDS else 'has no'} "
                "micro-batch id"
            )
        if self.duration_s < 0:
            raise ValueError(f"a span of negative duration {self.duration_s}")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def shifted(self, seconds: float) -> Span:
        """The same span on a clock that starts ``seconds`` earlier."""
        return replace(self, start_s=self.start_s + seconds)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "iteration": self.iteration,
            "kind": self.kind,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
        }
        if self.micro_batch is not None:
            out["micro_batch"] = self.micro_batch
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Span:
        mb = d.get("micro_batch")
        return cls(
            rank=int(d["rank"]),
            iteration=int(d["iteration"]),
            kind=str(d["kind"]),
            start_s=float(d["start_s"]),
            duration_s=float(d["duration_s"]),
            micro_batch=None if mb is None else int(mb),
        )


def micro_batch_id(micro_batch: MicroBatch) -> int:
    """The id of a micro-batch within its schedule: its first sample id (a schedule
    runs every sample at most once, so no two micro-batches share it)."""
    return micro_batch.sample_ids[0]


@dataclass(frozen=True)
class Placement:
    """Where a micro-batch of a schedule runs: its iteration and group."""

    iteration: Iteration
    group: Assignment
    micro_batch: MicroBatch


def placements(schedule: Schedule) -> dict[int, Placement]:
    """Every micro-batch of ``schedule`` by :func:`micro_batch_id`."""
    out: dict[int, Placement] = {}
    for iteration in schedule.iterations:
        for group in iteration.assignments:
            for mb in group.micro_batches:
                key = micro_batch_id(mb)
                if key in out:
                    raise ValueError(f"two micro-batches of the schedule have id {key}")
                out[key] = Placement(iteration, group, mb)
    return out


def busy_s(spans: Iterable[Span]) -> float:
    """Seconds spent in passes (every rank's, summed)."""
    return sum(s.duration_s for s in spans if s.kind in PASS_KINDS)


def relative_spread(values: Sequence[float]) -> float:
    """The largest relative difference between two repeated measurements of one thing:
    ``(max - min) / min`` (0 for a single value). Noise of the measurement, not of the
    thing measured: a difference between two things below it is not shown."""
    low = min(values)
    return (max(values) - low) / low if low > 0 else 0.0
