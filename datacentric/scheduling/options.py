"""Deprecated location: :class:`ScheduleOptions` is the ``[scheduling]`` section of the
settings schema, :mod:`datacentric.settings.scheduling` (torch-free, at the bottom)."""

from __future__ import annotations

from datacentric.settings.scheduling import ScheduleOptions

__all__ = ["ScheduleOptions"]
