"""The ``timeline`` of a ``metrics.jsonl`` record (``[metrics] timeline = true``): every
rank's :class:`~datacentric.timing.Span` records of the step, as JSON objects, times in
seconds from the step's start on that rank. The trainer gathers them into the step's
record (:func:`gather_spans`, :func:`timeline_json`); comparisons read them back
(:func:`timeline_spans`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.runtime import IterationStats
from datacentric.timing import Span


def gather_spans(stats: IterationStats, groups: ProcessGroups) -> list[Span]:
    """Every rank's spans of the step, rank by rank (collective)."""
    mine = stats.spans()
    if not groups.distributed or groups.world_size == 1:
        return mine
    everyone: list[Any] = [None] * groups.world_size
    dist.all_gather_object(everyone, [s.to_json() for s in mine], group=groups.world)
    return [Span.from_json(s) for rank_spans in everyone for s in rank_spans]


def timeline_json(spans: list[Span]) -> list[dict[str, Any]]:
    """The ``timeline`` field of a metrics record."""
    return [s.to_json() for s in spans]


def timeline_spans(record: dict[str, Any]) -> list[Span]:
    """The spans of a metrics record's ``timeline`` field."""
    if "timeline" not in record:
        raise KeyError(
            f"step {record.get('iteration')} has no timeline: train with timeline = true"
        )
    return [Span.from_json(s) for s in record["timeline"]]
