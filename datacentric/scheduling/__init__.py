"""The data-centric scheduler: pure functions from sample shapes to a Schedule.

``Pipeline(shapes, cost_model, world_size=..., memory_cap_bytes=...)`` plans the
buckets once (``.plan``) and returns each epoch's iterations (``.schedule(epoch)``,
through ``build_schedule``); every rank computes the same ones without communicating. Policies
(``POLICIES``): ``static``, ``packed``, ``dcp-intra``, ``dcp-inter``, ``dcp-pac``,
``megatron-dyncp`` and ``dcp-opt``. Their options are the ``[scheduling]`` section,
:class:`datacentric.settings.SchedulingConfig`. See ``docs/scheduling.md``.
"""

from datacentric.scheduling.epoch import POLICIES, build_schedule, epoch_rng
from datacentric.scheduling.measures import (
    ideal_epoch_time,
    iteration_imbalance,
    schedule_measures,
)
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import Position, continue_schedule, schedule_fingerprint
from datacentric.settings.scheduling import deprecated_schedule_options

__all__ = [
    "POLICIES",
    "Pipeline",
    "Position",
    "build_schedule",
    "continue_schedule",
    "epoch_rng",
    "ideal_epoch_time",
    "iteration_imbalance",
    "schedule_fingerprint",
    "schedule_measures",
]


def __getattr__(name: str) -> object:
    if name == "ScheduleOptions":  # deprecated: the [scheduling] section's older name
        return deprecated_schedule_options(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
