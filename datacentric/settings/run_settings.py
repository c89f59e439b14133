"""The resolved settings of a run: every section, flat, read from TOML and flags.

:class:`TrainConfig` inherits every section of :mod:`datacentric.settings.sections`
(and the ``[scheduling]`` options, :class:`~datacentric.settings.scheduling.
ScheduleOptions`), so code reads flat attributes (``config.lr``) or a typed section
(``config.section("training").lr``) while files and flags are sectioned (``[training]
lr = 3e-3``, ``--training.lr 3e-3``). Unknown sections and keys, wrong types and values
out of range are :class:`~datacentric.settings.schema.ConfigError` naming the key. The
resolved settings are written into a run folder as ``config.toml`` (and the flat
``config.json``). See ``docs/configuration.md``. No torch is imported here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.settings.scheduling import ScheduleOptions
from datacentric.settings.schema import (
    ConfigError,
    coerce,
    field_docs,
    field_types,
    suggest,
    toml_value,
)
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
    check_shard,
)

#: ``[cost]`` fields of the cost profiler's measurement a run chooses (model, world,
#: dtype, seed, progress and the clock come from the other sections and the device).
PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(MeasureSettings))


def _section_from(source: type, names: tuple[str, ...] | None, name: str) -> type:
    """A section with the fields ``names`` (all: ``None``) of dataclass ``source``,
    same types and defaults; their docs are read from ``source``."""
    hints = typing.get_type_hints(source)
    fields = [
        (f.name, hints[f.name], dataclasses.field(default=f.default))
        for f in dataclasses.fields(source)
        if names is None or f.name in names
    ]
    cls = dataclasses.make_dataclass(name, fields, kw_only=True)
    cls.__module__ = __name__
    cls.__doc_source__ = source
    return cls


ProfileSettingsConfig = _section_from(MeasureSettings, None, "ProfileSettingsConfig")
ScheduleOptionsConfig = _section_from(ScheduleOptions, None, "ScheduleOptionsConfig")

#: Section name -> the classes whose fields it holds, in file order.
SECTIONS: dict[str, tuple[type, ...]] = {
    "job": (JobConfig,),
    "model": (ModelConfig,),
    "lora": (LoraConfig,),
    "data": (DataConfig,),
    "training": (TrainingConfig,),
    "parallelism": (ParallelismConfig,),
    "checkpoint": (CheckpointConfig,),
    "metrics": (MetricsConfig,),
    "profiling": (ProfilingConfig,),
    "cost": (CostConfig, ProfileSettingsConfig),
    "scheduling": (SchedulingConfig, ScheduleOptionsConfig),
}

#: Sections whose keys carry the section's name as a prefix in the flat settings
#: (``lora_rank``) and are written without it inside the section (``[lora] rank``,
#: ``--lora.rank``).
PREFIXED_SECTIONS = ("lora",)


def name_in_section(key: str) -> str:
    """How ``key`` is written inside its section (``lora_rank`` -> ``rank``)."""
    section = section_of()[key]
    prefix = section + "_"
    return key.removeprefix(prefix) if section in PREFIXED_SECTIONS else key


def key_of(section: str, name: str) -> str:
    """The flat key of ``name`` written in ``[section]`` (``lora``, ``rank`` -> ``lora_rank``)."""
    return f"{section}_{name}" if section in PREFIXED_SECTIONS else name


#: Sections renamed since an earlier release: ``(old section, its keys) -> new section``.
#: Files may still write these keys under the old name (with a note), and ``--old.key``
#: flags stay as deprecated aliases: the key, and so the setting, is the same.
RENAMED_SECTIONS: dict[str, str] = {"profiling": "cost"}


def renamed_section_of(old: str, key: str) -> str | None:
    """The section ``key`` moved to from the renamed section ``old`` (None: it did not)."""
    new = RENAMED_SECTIONS.get(old)
    return new if new is not None and key in section_keys()[new] else None


@dataclass(kw_only=True)
class TrainConfig(
    ScheduleOptionsConfig,
    SchedulingConfig,
    ProfileSettingsConfig,
    CostConfig,
    ProfilingConfig,
    MetricsConfig,
    CheckpointConfig,
    ParallelismConfig,
    TrainingConfig,
    DataConfig,
    LoraConfig,
    ModelConfig,
    JobConfig,
):
    """Every setting of a run, flat; see :data:`SECTIONS` for the file layout."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the flat settings as JSON (``config.json``)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def to_toml(self) -> str:
        """The resolved configuration as sectioned TOML (unset values as comments)."""
        docs = field_docs(TrainConfig)
        lines: list[str] = []
        for section, keys in section_keys().items():
            lines.append(f"[{section}]")
            for key in keys:
                lines.append(f"# {docs.get(key, '')}")
                value = getattr(self, key)
                shown = "(unset)" if value is None else toml_value(value)
                lines.append(f"{'# ' if value is None else ''}{name_in_section(key)} = {shown}")
            lines.append("")
        return "\n".join(lines)

    def schedule_options(self) -> ScheduleOptions:
        """The ``[scheduling]`` options as :class:`ScheduleOptions`."""
        names = [f.name for f in dataclasses.fields(ScheduleOptions)]
        return ScheduleOptions(**{n: getattr(self, n) for n in names})

    def profile_settings(self) -> dict[str, Any]:
        """The ``[cost]`` fields of :class:`MeasureSettings` this run chooses."""
        return {n: getattr(self, n) for n in PROFILE_FIELDS}

    def section(self, name: str) -> Any:
        """The typed ``[name]`` section of these settings (``settings.section("training").lr``);
        ``cost`` and ``scheduling`` return their first class (see :data:`SECTIONS`)."""
        if name not in SECTIONS:
            raise KeyError(f"no section [{name}]{suggest(name, list(SECTIONS))}")
        cls = SECTIONS[name][0]
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})


def section_keys() -> dict[str, list[str]]:
    """Section name -> its keys, in order."""
    return {
        name: [f.name for cls in classes for f in dataclasses.fields(cls)]
        for name, classes in SECTIONS.items()
    }


def section_of() -> dict[str, str]:
    """Key -> the section holding it."""
    return {key: section for section, keys in section_keys().items() for key in keys}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _flatten(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Sectioned TOML -> ``{key: value}``; unknown sections or keys are errors. The flat
    layout of earlier releases (a ``[train]`` table or top-level keys) still loads,
    with a note."""
    owners = section_of()
    keys_of = section_keys()
    flat: dict[str, Any] = {}
    legacy = dict(data.pop("train", None) or {})
    legacy.update({k: v for k, v in data.items() if not isinstance(v, dict)})
    for key in legacy:
        if key not in owners:
            raise ConfigError(f"{where}: unknown key {key!r}{suggest(key, list(owners))}")
        data.pop(key, None)
    if legacy:
        print(
            f"datacentric: note: {where}: flat settings (a [train] table or top-level keys) "
            "are deprecated; use sections (`datacentric config --show` prints them)",
            file=sys.stderr,
        )
        flat.update(legacy)
    for name, table in data.items():
        if name not in SECTIONS:
            raise ConfigError(f"{where}: unknown section [{name}]{suggest(name, list(SECTIONS))}")
        for key, value in table.items():
            key = key_of(name, key)
            moved = renamed_section_of(name, key)
            if moved is not None:
                print(
                    f"datacentric: note: {where}: [{name}] {key} is deprecated; "
                    f"write it under [{moved}] (the same setting)",
                    file=sys.stderr,
                )
            elif key not in keys_of[name]:
                hint = f" (it belongs in [{owners[key]}])" if key in owners else ""
                raise ConfigError(
                    f"{where}: unknown key {name}.{key}{hint or suggest(key, keys_of[name])}"
                )
            flat[key] = value
    return flat


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Build a config from a TOML file (optional), then flat keyword overrides.

    Overrides whose value is ``None`` are ignored so that unset CLI flags keep the
    file's (or default) value. Raises :class:`ConfigError` naming the key.
    """
    owners = section_of()
    values: dict[str, Any] = {} if path is None else _read_file(path)
    for key, value in overrides.items():
        if key not in owners:
            raise ConfigError(f"unknown configuration key {key!r}{suggest(key, list(owners))}")
        if value is not None:
            values[key] = value
    return build_config(values)


def _read_file(path: str | Path) -> dict[str, Any]:
    """The flat ``{key: value}`` a TOML file sets (not yet checked)."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a folder; name a TOML file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"--config {path}: not a text TOML file (byte {err.start} is not UTF-8)"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config {path}: not valid TOML: {err}") from None
    return _flatten(data, str(path))


def file_settings(path: str | Path) -> dict[str, Any]:
    """The checked values of the keys a TOML file sets (and only those): the whole file
    is checked as :func:`load_config` does. Commands other than ``train`` take the keys
    they have flags for from it."""
    values = _read_file(path)
    config = build_config(values)
    return {key: getattr(config, key) for key in values}


def build_config(values: dict[str, Any]) -> TrainConfig:
    """Type- and range-check flat ``values`` and build the config."""
    owners = section_of()
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    kinds = field_types(TrainConfig)
    checked = {
        key: coerce(f"{owners[key]}.{key}", value, kinds[key], fields[key])
        for key, value in values.items()
    }
    config = TrainConfig(**checked)
    validate(config)
    return config


def validate(config: TrainConfig) -> None:
    """Settings that are each valid but cannot work together, or need parsing."""
    if config.fault_inject is not None:
        parse_fault(config.fault_inject)
    resuming = config.resume or config.resume_from is not None
    if config.overwrite and resuming:
        flag = "--resume" if config.resume else "--resume-from"
        raise ConfigError(
            f"job.overwrite and checkpoint.{flag[2:].replace('-', '_')} cannot both be set: "
            f"--overwrite deletes the run that {flag} continues; drop one of them"
        )
    if config.expect_sha256 is not None:
        digest = config.expect_sha256.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(
                "checkpoint.expect_sha256: needs 64 hexadecimal digits (the SHA-256 of "
                f"manifest.json), got {config.expect_sha256!r}"
            )
        if not resuming:
            raise ConfigError(
                "checkpoint.expect_sha256: only checked when resuming; pass --resume or "
                "--resume-from with it"
            )
    try:
        check_shard(config.shard, config.reshard_after_forward)
    except ValueError as err:
        raise ConfigError(f"parallelism.shard: {err}") from None
    if config.device is not None and config.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(
            f"parallelism.device: must be 'cpu', 'cuda' or 'cuda:N', got {config.device!r}"
        )
    try:
        config.schedule_options()
    except ValueError as err:
        raise ConfigError(f"scheduling: {err}") from None
    if any(step < 1 for step in config.trace_steps):
        low = min(config.trace_steps)
        raise ConfigError(f"profiling.trace_steps: steps are numbered from 1, got {low}")
    if config.warmup < 2:
        raise ConfigError(f"cost.warmup: must be >= 2, got {config.warmup}")
    if config.repeats < 1:
        raise ConfigError(f"cost.repeats: must be >= 1, got {config.repeats}")
    if config.timeout_s <= 0:
        raise ConfigError(f"cost.timeout_s: must be > 0, got {config.timeout_s}")


def parse_fault(spec: str) -> tuple[int, int, str]:
    """``RANK:ITERATION[:kill|hang]`` -> (rank, iteration, mode)."""
    parts = spec.split(":")
    mode = parts[2] if len(parts) == 3 else "kill"
    try:
        if len(parts) not in (2, 3) or mode not in ("kill", "hang", "term", "stop"):
            raise ValueError
        rank, iteration = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError(
            "training.fault_inject: must be 'RANK:ITERATION' or 'RANK:ITERATION:hang|term|stop' "
            f"(e.g. '1:3'), got {spec!r}"
        ) from None
    return rank, iteration, mode
