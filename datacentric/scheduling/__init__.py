"""The data-centric scheduler: pure functions from sample shapes to a Schedule.

``build_schedule(shapes, policy=..., world_size=..., cost_model=...)`` returns the
epoch's iterations; every rank computes the same one without communicating. Policies
(``POLICIES``): ``static``, ``packed``, ``dcp-intra``, ``dcp-inter``, ``dcp-pac``,
``megatron-dyncp`` and ``dcp-opt``. See ``docs/scheduling.md``.
"""

from datacentric.scheduling.epoch import POLICIES, build_schedule, epoch_rng
from datacentric.scheduling.measures import (
    ideal_epoch_time,
    iteration_imbalance,
    schedule_measures,
)
from datacentric.scheduling.options import ScheduleOptions
from datacentric.scheduling.resume import Position, continue_schedule, schedule_fingerprint

__all__ = [
    "POLICIES",
    "Position",
    "ScheduleOptions",
    "build_schedule",
    "continue_schedule",
    "epoch_rng",
    "ideal_epoch_time",
    "iteration_imbalance",
    "schedule_fingerprint",
    "schedule_measures",
]
