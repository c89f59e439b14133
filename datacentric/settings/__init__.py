"""The settings schema: typed sections, TOML and flags, and no torch.

It sits at the bottom of the package (it imports nothing of ours outside itself), so
every command builds its flags and reads its TOML keys from it without importing the
runtime: :mod:`~datacentric.settings.sections` (one dataclass per ``[section]``),
:mod:`~datacentric.settings.scheduling` (the ``[scheduling]`` section: the policy and
its options, the one type the pipeline and the policies take),
:mod:`~datacentric.settings.layout` (which section holds which key),
:mod:`~datacentric.settings.run_settings` (:class:`TrainConfig`, one object of every
section, and :func:`load_config`) and :mod:`~datacentric.settings.schema` (docs, checks, TOML).
"""

from __future__ import annotations

from datacentric.settings.layout import SECTIONS, section_keys, section_of
from datacentric.settings.run_settings import TrainConfig, build_config, file_settings, load_config
from datacentric.settings.scheduling import (
    POLICY_NAMES,
    SchedulingConfig,
    deprecated_schedule_options,
)
from datacentric.settings.schema import ConfigError
from datacentric.settings.sections import DEFAULT_MEMORY_FRACTION, DEFAULT_SHARD, SHARD_MODES

__all__ = [
    "DEFAULT_MEMORY_FRACTION",
    "DEFAULT_SHARD",
    "POLICY_NAMES",
    "SECTIONS",
    "SHARD_MODES",
    "ConfigError",
    "SchedulingConfig",
    "TrainConfig",
    "build_config",
    "file_settings",
    "load_config",
    "section_keys",
    "section_of",
]


def __getattr__(name: str) -> object:
    if name == "ScheduleOptions":  # deprecated: the [scheduling] section's older name
        return deprecated_schedule_options(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
