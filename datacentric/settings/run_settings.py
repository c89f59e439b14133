"""The resolved settings of a run: one object of sections, read from TOML and flags.

:class:`TrainConfig` is composed of the sections of :mod:`datacentric.settings.sections`
(the layout: :data:`~datacentric.settings.layout.SECTIONS`), as torchtitan's
``JobConfig``: code reads a section (``settings.training.lr``) and hands each component
its own (``settings.data``, ``settings.scheduling``); files and flags are
sectioned too (``[training] lr = 3e-3``, ``--training.lr 3e-3``). Unknown sections and
keys, wrong types and values out of range are
:class:`~datacentric.settings.schema.ConfigError` naming the key. The resolved settings
are written into a run folder as ``config.toml`` and ``config.json``, both by section
(an earlier release's flat ``config.json`` still reads, with a note); commands update
them by section (:meth:`TrainConfig.updated`). Flat attribute access (``config.lr``) and
flat keyword construction (``TrainConfig(lr=...)``) of earlier releases still work, with
a ``DeprecationWarning``. See ``docs/configuration.md``. No torch is imported here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.log import get_logger
from datacentric.regular_files import NotRegularFileError, kind_of, open_regular
from datacentric.settings.checks import check_resume, check_validation, parse_fault
from datacentric.settings.layout import (
    SECTIONS,
    Sections,
    flat_docs,
    flat_index,
    key_of,
    name_in_section,
    renamed_section_of,
    section_keys,
    section_of,
)
from datacentric.settings.scheduling import SchedulingConfig, with_older_names
from datacentric.settings.schema import (
    ConfigError,
    coerce,
    field_types,
    our_key,
    plain_value,
    suggest,
    toml_value,
)
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
    check_shard,
)


def recorded_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The settings a run folder records (``config.toml``, ``config.json``, its
    checkpoints'), of ``record`` (:meth:`TrainConfig.to_json`'s): a copy without what a
    start does once, ``overwrite`` (the folder was cleared before the run began),
    ``resume_from`` and ``expect_sha256`` (the checkpoint it started from), so that fed
    back they continue the run with ``--resume``, or are refused as a run already there."""
    job = {**record["job"], "overwrite": False}
    checkpoint = {**record["checkpoint"], "resume_from": None, "expect_sha256": None}
    return {**record, "job": job, "checkpoint": checkpoint}


def record_toml(record: dict[str, Any]) -> str:
    """Settings held as JSON data by section (:meth:`TrainConfig.to_json`'s) as sectioned
    TOML, each key under its doc line, unset values as comments (``config.toml``)."""
    docs = flat_docs()
    lines: list[str] = []
    for section, keys in section_keys().items():
        lines.append(f"[{section}]")
        for key in keys:
            name = name_in_section(key)
            lines.append(f"# {docs.get(key, '')}")
            value = record[section][name]
            shown = "(unset)" if value is None else toml_value(value)
            lines.append(f"{'# ' if value is None else ''}{name} = {shown}")
        lines.append("")
    return "\n".join(lines)


def save_record(record: dict[str, Any], path: str | Path) -> None:
    """Write settings held as JSON data by section (:meth:`TrainConfig.to_json`'s) as
    ``config.json`` at ``path`` (what :meth:`TrainConfig.save` writes)."""
    Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _warn_flat(key: str, stacklevel: int = 3) -> None:
    section, name = flat_index()[key]
    warnings.warn(
        f"TrainConfig.{key} (flat settings) is deprecated; use settings.{section}.{name}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _sections_of(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat ``{key: value}`` -> ``{section: {field: value}}``."""
    grouped: dict[str, dict[str, Any]] = {}
    index = flat_index()
    for key, value in flat.items():
        if key not in index:
            raise TypeError(f"TrainConfig has no setting {key!r}{suggest(key, list(index))}")
        section, name = index[key]
        grouped.setdefault(section, {})[name] = value
    return grouped


@dataclass(kw_only=True, init=False)
class TrainConfig(Sections):
    """Every setting of a run: one field per section (``settings.training.lr``), the
    sections of :class:`~datacentric.settings.layout.Sections`."""

    def __init__(
        self,
        *,
        job: JobConfig | None = None,
        model: ModelConfig | None = None,
        lora: LoraConfig | None = None,
        data: DataConfig | None = None,
        training: TrainingConfig | None = None,
        parallelism: ParallelismConfig | None = None,
        checkpoint: CheckpointConfig | None = None,
        metrics: MetricsConfig | None = None,
        profiling: ProfilingConfig | None = None,
        cost: CostConfig | None = None,
        scheduling: SchedulingConfig | None = None,
        validation: ValidationConfig | None = None,
        **flat: Any,
    ) -> None:
        """The sections (``training=TrainingConfig(lr=0.01)``; an unset one takes its
        defaults); flat keys (``lr=0.01``, deprecated) are set over them."""
        arguments = locals()  # the sections' parameters, named as SECTIONS names them
        given = {name: arguments[name] for name in SECTIONS}
        if model is not None and not _is_section("model", model):
            flat["model"], given["model"] = model, None  # TrainConfig(model="llama")
        for key in flat:
            _warn_flat(key)
        grouped = _sections_of(flat)
        for name, cls in SECTIONS.items():
            if given[name] is not None and not isinstance(given[name], cls):
                raise TypeError(f"TrainConfig({name}=...) needs a {cls.__name__}")
            section = given[name] if given[name] is not None else cls()
            if name in grouped:
                section = _updated(section, grouped[name])
            object.__setattr__(self, name, section)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> TrainConfig:
        """The settings of flat ``{key: value}`` (``config.json``, keyword overrides),
        unchecked (:func:`build_config` checks them)."""
        grouped = _sections_of(values)
        return cls(**{name: c(**grouped.get(name, {})) for name, c in SECTIONS.items()})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in flat_index():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        _warn_flat(name)
        section, field_name = flat_index()[name]
        return getattr(object.__getattribute__(self, section), field_name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in flat_index() and not (name in SECTIONS and _is_section(name, value)):
            _warn_flat(name)
            section, field_name = flat_index()[name]
            setattr(getattr(self, section), field_name, value)
            return
        object.__setattr__(self, name, value)

    def sections(self) -> dict[str, dict[str, Any]]:
        """``{section: {field: value}}`` of every setting (the layout of ``config.json``)."""
        return {
            name: {f.name: getattr(getattr(self, name), f.name) for f in dataclasses.fields(c)}
            for name, c in SECTIONS.items()
        }

    def flat(self) -> dict[str, Any]:
        """Deprecated (removed in 0.3.0): ``{flat key: value}`` of every setting, the
        layout of an earlier release's ``config.json``; read :meth:`sections`."""
        warnings.warn(
            "TrainConfig.flat() is deprecated (removed in 0.3.0): settings are sectioned; "
            "use settings.sections() or settings.to_json()",
            DeprecationWarning,
            stacklevel=2,
        )
        return {
            key: getattr(getattr(self, section), name)
            for key, (section, name) in flat_index().items()
        }

    def updated(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` set by section, checked as :func:`build_config` checks
        (``settings.updated(scheduling={"policy": "static"}, job={"out": "runs/b"})``).
        A flat key (``policy="static"``) still works, with a ``DeprecationWarning``."""
        values = self.sections()
        for key, change in changes.items():
            if key in SECTIONS and isinstance(change, dict):
                section, given = key, change
            elif key in flat_index():
                _warn_flat(key)
                section, name = flat_index()[key]
                given = {name: change}
            else:
                raise TypeError(f"TrainConfig has no section [{key}]{suggest(key, list(SECTIONS))}")
            values[section] = (
                with_older_names(values[section], given)
                if section == "scheduling"
                else {**values[section], **given}
            )
        return build_sections(values)

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON data, by section (``config.json``, a checkpoint's record)."""
        return json.loads(json.dumps(self.sections(), default=plain_value))

    @classmethod
    def from_record(cls, record: dict[str, Any], where: str = "config.json") -> TrainConfig:
        """The checked settings of a stored record (:func:`record_sections`: sectioned, or
        an earlier release's flat keys)."""
        return build_sections(record_sections(record, where))

    def save(self, path: str | Path) -> None:
        """Write the settings as JSON, by section (``config.json``: :func:`save_record`)."""
        save_record(self.to_json(), path)

    def to_toml(self) -> str:
        """The resolved configuration as sectioned TOML (unset values as comments:
        :func:`record_toml`)."""
        return record_toml(self.to_json())

    def schedule_options(self) -> SchedulingConfig:
        """Deprecated: the ``[scheduling]`` section is what the pipeline and the policies
        take; read ``settings.scheduling``."""
        warnings.warn(
            "TrainConfig.schedule_options() is deprecated (removed in 0.3.0): the pipeline "
            "and the policies take settings.scheduling as it is",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.scheduling

    def profile_settings(self) -> dict[str, Any]:
        """Deprecated: the cost profiler takes the ``[cost]`` section as it is
        (``ProfileSettings(cost=settings.cost)``)."""
        warnings.warn(
            "TrainConfig.profile_settings() is deprecated (removed in 0.3.0): the cost "
            "profiler takes settings.cost (ProfileSettings(cost=settings.cost))",
            DeprecationWarning,
            stacklevel=2,
        )
        names = ("warmup", "repeats", "threads_per_rank", "timeout_s", "interleave")
        return {name: getattr(self.cost, name) for name in names}

    def section(self, name: str) -> Any:
        """The typed ``[name]`` section (``settings.section("training")`` is
        ``settings.training``)."""
        if name not in SECTIONS:
            raise KeyError(f"no section [{name}]{suggest(name, list(SECTIONS))}")
        return getattr(self, name)


def _updated(section: Any, values: dict[str, Any]) -> Any:
    """A copy of ``section`` with ``values`` set (the scheduling section keeps an older
    name and its new one together)."""
    if isinstance(section, SchedulingConfig):
        return section.updated(**values)
    return dataclasses.replace(section, **values)


def _is_section(name: str, value: Any) -> bool:
    return isinstance(value, SECTIONS[name])


def field_names() -> list[str]:
    """Every flat key, in file order."""
    return list(flat_index())


def _flatten(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Sectioned TOML -> ``{key: value}``; unknown sections or keys are errors. The flat
    layout of earlier releases (a ``[train]`` table or top-level keys) and a renamed
    section (``[profiling]``'s cost keys) still load, with a note; one setting given in
    two of these places with two values is an error naming both."""
    owners = section_of()
    keys_of = section_keys()
    flat: dict[str, Any] = {}
    places: dict[str, str] = {}  # key -> where the file set it (for a second setting)
    legacy = [(f"[train] {k}", k, v) for k, v in dict(data.pop("train", None) or {}).items()]
    legacy += [(f"top-level {k}", k, v) for k, v in data.items() if not isinstance(v, dict)]
    for place, key, value in legacy:
        if key not in owners:
            raise ConfigError(f"{where}: unknown key {key!r}{suggest(key, list(owners))}")
        data.pop(key, None)
        _set_once(flat, places, key, value, place, where)
    if legacy:
        get_logger().warning(
            f"datacentric: note: {where}: flat settings (a [train] table or top-level keys) "
            "are deprecated; use sections (`datacentric config --show` prints them)"
        )
    for name, table in data.items():
        if name not in SECTIONS:
            raise ConfigError(f"{where}: unknown section [{name}]{suggest(name, list(SECTIONS))}")
        for key, value in table.items():
            key = key_of(name, key)
            moved = renamed_section_of(name, key)
            if moved is not None:
                get_logger().warning(
                    f"datacentric: note: {where}: [{name}] {key} is deprecated; "
                    f"write it under [{moved}] (the same setting)"
                )
            elif key not in keys_of[name]:
                hint = f" (it belongs in [{owners[key]}])" if key in owners else ""
                ours = our_key(key, owners)
                if not hint and ours in owners and ours not in keys_of[name]:
                    hint = f" (did you mean {name_in_section(ours)!r} in [{owners[ours]}]?)"
                raise ConfigError(
                    f"{where}: unknown key {name}.{key}{hint or suggest(key, keys_of[name])}"
                )
            _set_once(flat, places, key, value, f"[{name}] {name_in_section(key)}", where)
    return flat


def _set_once(
    flat: dict[str, Any], places: dict[str, str], key: str, value: Any, place: str, where: str
) -> None:
    """Set ``flat[key]`` from ``place`` of the file ``where``; a setting the file gave
    already (under an older layout's name) with another value is an error naming both."""
    if key in flat and flat[key] != value:
        raise ConfigError(
            f"{where}: {places[key]} = {toml_value(plain_value(flat[key]))} and {place} = "
            f"{toml_value(plain_value(value))} are one setting ([{section_of()[key]}] "
            f"{name_in_section(key)}); give it once"
        )
    flat[key], places[key] = value, place


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Build a config from a TOML file (optional), then flat keyword overrides.

    Overrides whose value is ``None`` are ignored so that unset CLI flags keep the
    file's (or default) value; an override replaces the file's value under the
    setting's older or newer name too (``--global-batch-tokens`` over the
    ``tokens_per_iteration`` a run folder's ``config.toml`` writes beside it). Raises
    :class:`ConfigError` naming the key.
    """
    owners = section_of()
    from_file: dict[str, Any] = {} if path is None else _read_file(path)
    for key in overrides:
        if key not in owners:
            raise ConfigError(f"unknown configuration key {key!r}{suggest(key, list(owners))}")
    given = {key: value for key, value in overrides.items() if value is not None}
    replaced = with_older_names({}, given)  # the keys given, and their other names
    kept = {key: value for key, value in from_file.items() if key not in replaced}
    return _build_naming_file({**kept, **replaced}, kept, path)


def _build_naming_file(
    values: dict[str, Any], from_file: dict[str, Any], path: str | Path | None
) -> TrainConfig:
    """:func:`build_config`; a refusal of a value the TOML file at ``path`` set (in
    ``from_file``) names the file."""
    try:
        return build_config(values)
    except ConfigError as err:
        index = flat_index()
        named = {".".join(index[k]) for k in from_file if k in index}
        if path is not None and str(err).split(":")[0] in named:
            raise ConfigError(f"--config {path}: {err}") from None
        raise


def _read_file(path: str | Path) -> dict[str, Any]:
    """The flat ``{key: value}`` a TOML file sets (not yet checked)."""
    try:
        with open_regular(path, "rb") as handle:  # a FIFO must not block
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (IsADirectoryError, NotRegularFileError):
        what = kind_of(os.stat(path).st_mode)
        raise ConfigError(f"--config {path}: is {what}, not a file; name a TOML file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"--config {path}: not a text TOML file (byte {err.start} is not UTF-8)"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config {path}: not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"--config {path}: nested too deeply to read") from None
    except ValueError as err:  # an integer of more than sys.get_int_max_str_digits()
        first = str(err).split(";")[0]
        raise ConfigError(f"--config {path}: holds a value that cannot be read ({first})") from None
    return _flatten(data, str(path))


def file_settings(path: str | Path) -> dict[str, Any]:
    """The checked values of the keys a TOML file sets (and only those, a setting under
    both its names): the whole file is checked as :func:`load_config` does. Commands
    other than ``train`` take the keys they have flags for from it."""
    values = _read_file(path)
    config = _build_naming_file(values, values, path)
    index = flat_index()
    keys = with_older_names({}, values)  # a setting under an older name is its new one's too
    return {key: getattr(getattr(config, index[key][0]), index[key][1]) for key in keys}


def build_config(values: dict[str, Any]) -> TrainConfig:
    """Type- and range-check flat ``values`` (a settings file's or flags' keys) and build
    the config."""
    return build_sections(_sections_of(values))


def build_sections(values: dict[str, dict[str, Any]]) -> TrainConfig:
    """Type- and range-check ``{section: {field: value}}`` and build the config."""
    sections = {}
    for name, cls in SECTIONS.items():
        given = values.get(name, {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kinds = field_types(cls)
        unknown = [key for key in given if key not in fields]
        if unknown:
            raise ConfigError(f"unknown key {name}.{unknown[0]}{suggest(unknown[0], list(fields))}")
        checked = {
            key: coerce(f"{name}.{key}", value, kinds[key], fields[key])
            for key, value in given.items()
        }
        try:
            sections[name] = cls(**checked)
        except ValueError as err:  # a section's own check (the scheduling options)
            raise ConfigError(str(err)) from None
    config = TrainConfig(**sections)
    validate(config)
    return config


def record_sections(record: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` of a stored settings record (a run folder's
    ``config.json``, a checkpoint's): sectioned, as written since 0.2.0, or the flat keys
    of an earlier release, read with a deprecation note (keys no release had are
    reported, never dropped silently)."""
    if any(key in SECTIONS and isinstance(value, dict) for key, value in record.items()):
        for key, value in record.items():  # by section: every key a section, of settings
            if key not in SECTIONS:
                raise ConfigError(
                    f"{where}: unknown section {str(key)[:80]!r} (sections: {', '.join(SECTIONS)})"
                )
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: section {key!r} holds a {type(value).__name__}, not its settings"
                )
        return {name: dict(record.get(name, {})) for name in SECTIONS}
    unknown = [key for key in record if key not in flat_index()]
    if unknown:
        raise ConfigError(f"{where}: unknown settings key {unknown[0]!r}")
    get_logger().warning(
        f"datacentric: note: {where}: flat settings keys (written before 0.2.0) are "
        "deprecated; a run saves its settings by section"
    )
    grouped = _sections_of(record)
    return {name: grouped.get(name, {}) for name in SECTIONS}


def validate(config: TrainConfig) -> None:
    """Settings that are each valid but cannot work together, or need parsing."""
    if config.training.fault_inject is not None:
        parse_fault(config.training.fault_inject)
    check_resume(config.job, config.checkpoint)
    parallelism = config.parallelism
    try:
        check_shard(parallelism.shard, parallelism.reshard_after_forward)
    except ValueError as err:
        raise ConfigError(f"parallelism.shard: {err}") from None
    if parallelism.device is not None and parallelism.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(
            f"parallelism.device: must be 'cpu', 'cuda' or 'cuda:N', got {parallelism.device!r}"
        )
    try:
        config.scheduling.check()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if any(step < 1 for step in config.profiling.trace_steps):
        low = min(config.profiling.trace_steps)
        raise ConfigError(f"profiling.trace_steps: steps are numbered from 1, got {low}")
    check_validation(config.validation, config.training, config.checkpoint)
    if config.training.caption_dropout > 1:
        raise ConfigError(
            f"training.caption_dropout: a probability from 0 to 1, got "
            f"{config.training.caption_dropout}"
        )
    cost = config.cost
    if cost.warmup < 2:
        raise ConfigError(f"cost.warmup: must be >= 2, got {cost.warmup}")
    if cost.repeats < 1:
        raise ConfigError(f"cost.repeats: must be >= 1, got {cost.repeats}")
    if cost.timeout_s <= 0:
        raise ConfigError(f"cost.timeout_s: must be > 0, got {cost.timeout_s}")
