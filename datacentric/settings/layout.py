"""The layout of a run's settings: which section holds which key (torch-free).

A run's settings are one object of sections (:class:`~datacentric.settings.run_settings.
TrainConfig`: ``settings.training.lr``); files and flags name a key by its section
(``[training] lr``, ``--training.lr``); the *flat key* of a setting (``lr``,
``lora_rank``) is its one name across sections, used by ``config.json``, keyword
overrides (:func:`~datacentric.settings.run_settings.load_config`) and the short flags
(``--lr``). This module maps one to the other and is the one place that does.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any

from datacentric.settings.scheduling import ScheduleOptions
from datacentric.settings.schema import field_docs, field_types
from datacentric.settings.sections import (
    CheckpointConfig,
    CostConfig,
    DataConfig,
    JobConfig,
    LoraConfig,
    MeasureSettings,
    MetricsConfig,
    ModelConfig,
    ParallelismConfig,
    ProfilingConfig,
    SchedulingConfig,
    TrainingConfig,
    ValidationConfig,
)


def _section_from(source: type, name: str) -> type:
    """A mutable section with the fields of the frozen dataclass ``source``, same
    types and defaults; their docs are read from ``source``."""
    hints = typing.get_type_hints(source)
    fields = [
        (f.name, hints[f.name], dataclasses.field(default=f.default))
        for f in dataclasses.fields(source)
    ]
    cls = dataclasses.make_dataclass(name, fields, kw_only=True)
    cls.__module__ = __name__
    cls.__doc_source__ = source
    return cls


ProfileSettingsConfig = _section_from(MeasureSettings, "ProfileSettingsConfig")
ScheduleOptionsConfig = _section_from(ScheduleOptions, "ScheduleOptionsConfig")

#: ``[cost]`` fields of the cost profiler's measurement a run chooses (model, world,
#: dtype, seed, progress and the clock come from the other sections and the device).
PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(MeasureSettings))
#: ``[scheduling]`` fields that are :class:`ScheduleOptions` (all but ``policy``).
OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(ScheduleOptions))


@dataclass(kw_only=True)
class CostSettings(ProfileSettingsConfig, CostConfig):
    """The ``[cost]`` section: the cost model and how the cost profiler measures."""

    def measure_settings(self) -> dict[str, Any]:
        """The cost profiler's measurement settings (``MeasureSettings`` fields)."""
        return {n: getattr(self, n) for n in PROFILE_FIELDS}


@dataclass(kw_only=True)
class SchedulingSettings(ScheduleOptionsConfig, SchedulingConfig):
    """The ``[scheduling]`` section: the policy and its :class:`ScheduleOptions`."""

    def options(self) -> ScheduleOptions:
        """The options every policy reads (raises ``ValueError`` for a bad one)."""
        return ScheduleOptions(**{n: getattr(self, n) for n in OPTION_FIELDS})


#: Section name -> its dataclass, in file order.
SECTIONS: dict[str, type] = {
    "job": JobConfig,
    "model": ModelConfig,
    "lora": LoraConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "parallelism": ParallelismConfig,
    "checkpoint": CheckpointConfig,
    "metrics": MetricsConfig,
    "profiling": ProfilingConfig,
    "cost": CostSettings,
    "scheduling": SchedulingSettings,
    "validation": ValidationConfig,
}

#: Sections whose flat keys carry the section's name as a prefix (``lora_rank``); the
#: section's field, file key and section flag have none (``[lora] rank``, ``--lora.rank``).
PREFIXED_SECTIONS = ("lora", "validation")

#: Sections renamed since an earlier release: ``old section -> new section``. Files may
#: still write these keys under the old name (with a note), and ``--old.key`` flags stay
#: as deprecated aliases: the key, and so the setting, is the same.
RENAMED_SECTIONS: dict[str, str] = {"profiling": "cost"}


def key_of(section: str, name: str) -> str:
    """The flat key of field ``name`` of ``[section]`` (``lora``, ``rank`` -> ``lora_rank``)."""
    return f"{section}_{name}" if section in PREFIXED_SECTIONS else name


@functools.cache
def flat_index() -> dict[str, tuple[str, str]]:
    """Flat key -> (its section, its field there), in file order."""
    return {
        key_of(section, f.name): (section, f.name)
        for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
    }


def section_keys() -> dict[str, list[str]]:
    """Section name -> its flat keys, in order."""
    keys: dict[str, list[str]] = {name: [] for name in SECTIONS}
    for key, (section, _) in flat_index().items():
        keys[section].append(key)
    return keys


def section_of() -> dict[str, str]:
    """Flat key -> the section holding it."""
    return {key: section for key, (section, _) in flat_index().items()}


def name_in_section(key: str) -> str:
    """How flat ``key`` is named inside its section (``lora_rank`` -> ``rank``)."""
    return flat_index()[key][1]


def renamed_section_of(old: str, key: str) -> str | None:
    """The section ``key`` moved to from the renamed section ``old`` (None: it did not)."""
    new = RENAMED_SECTIONS.get(old)
    return new if new is not None and key in section_keys()[new] else None


@functools.cache
def flat_fields() -> dict[str, dataclasses.Field]:
    """Flat key -> its section's dataclass field (default, range metadata)."""
    fields = {s: {f.name: f for f in dataclasses.fields(c)} for s, c in SECTIONS.items()}
    return {key: fields[s][name] for key, (s, name) in flat_index().items()}


@functools.cache
def flat_docs() -> dict[str, str]:
    """Flat key -> its one-line doc (the help text of its flags)."""
    docs = {s: field_docs(c) for s, c in SECTIONS.items()}
    return {key: docs[s].get(name, "") for key, (s, name) in flat_index().items()}


@functools.cache
def flat_types() -> dict[str, Any]:
    """Flat key -> its resolved type."""
    kinds = {s: field_types(c) for s, c in SECTIONS.items()}
    return {key: kinds[s][name] for key, (s, name) in flat_index().items()}


def flat_defaults() -> dict[str, Any]:
    """Flat key -> its default value."""
    return {key: f.default for key, f in flat_fields().items()}
