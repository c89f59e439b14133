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
from typing import Any

from datacentric.settings.scheduling import SchedulingConfig
from datacentric.settings.schema import field_docs, field_types
from datacentric.settings.sections import (
    CheckpointConfig,
    CostConfig,
    DataConfig,
    JobConfig,
    LoraConfig,
    MetricsConfig,
    ModelConfig,
    ParallelismConfig,
    ProfilingConfig,
    TrainingConfig,
    ValidationConfig,
)


@dataclasses.dataclass(kw_only=True, init=False)
class Sections:
    """The sections of a run's settings, in file order: the one list of them.
    :class:`~datacentric.settings.run_settings.TrainConfig` holds these fields (it
    derives from this class) and :data:`SECTIONS` is read from it."""

    job: JobConfig = dataclasses.field(default_factory=JobConfig)
    """``[job]``: run folder, seed, overwrite."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """``[model]``: the model, its arguments and dtype."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """``[lora]``: LoRA fine-tuning."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    """``[data]``: the dataset and how it is read."""
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    """``[training]``: optimizer, learning rate, length of the run."""
    parallelism: ParallelismConfig = dataclasses.field(default_factory=ParallelismConfig)
    """``[parallelism]``: ranks, sharding, device."""
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    """``[checkpoint]``: saving and resuming."""
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    """``[metrics]``: logs, TensorBoard, W&B, plots."""
    profiling: ProfilingConfig = dataclasses.field(default_factory=ProfilingConfig)
    """``[profiling]``: ``torch.profiler`` traces."""
    cost: CostConfig = dataclasses.field(default_factory=CostConfig)
    """``[cost]``: the cost model and the cost profiler."""
    scheduling: SchedulingConfig = dataclasses.field(default_factory=SchedulingConfig)
    """``[scheduling]``: the policy and its options."""
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    """``[validation]``: the held-out loss during training."""


#: Section name -> its dataclass, in file order (read from :class:`Sections`).
SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(Sections)
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
