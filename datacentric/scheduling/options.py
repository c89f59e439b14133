"""Deprecated location (removed in 0.3.0): the ``[scheduling]`` options are the settings
schema's, :mod:`datacentric.settings.scheduling` (torch-free, at the bottom); importing
this module warns (``DeprecationWarning``)."""

from __future__ import annotations

import warnings

from datacentric.settings.scheduling import SchedulingConfig

ScheduleOptions = SchedulingConfig

__all__ = ["ScheduleOptions"]

warnings.warn(
    "datacentric.scheduling.options is deprecated and will be removed in 0.3.0: import "
    "from datacentric.settings instead",
    DeprecationWarning,
    stacklevel=2,
)
