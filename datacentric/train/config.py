"""The typed, sectioned configuration of ``datacentric`` runs (TOML file and flags).

Sections follow torchtitan's layout: ``[job]``, ``[model]``, ``[data]``,
``[training]``, ``[parallelism]``, ``[checkpoint]``, ``[metrics]``, ``[profiling]``
and ``[scheduling]`` (the latter two include every field of
:class:`~datacentric.profiling.profiler.ProfileSettings` that a run chooses and of
:class:`~datacentric.scheduling.options.ScheduleOptions`). :class:`TrainConfig`
inherits every section, so code reads flat attributes (``config.lr``) while files
and flags are sectioned (``[training] lr = 3e-3``, ``--training.lr 3e-3``).

Each field's docstring (the string right under it) is its help text; ranges live in
the field (:func:`~datacentric.train.config_schema.setting`); choices are
``Literal`` types. Unknown sections and keys, wrong types and values out of range
are :class:`~datacentric.train.config_schema.ConfigError` naming the key. The
resolved configuration is written into a run folder as ``config.toml`` (and the
flat ``config.json``). See ``docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.profiling.profiler import ProfileSettings
from datacentric.scheduling.options import ScheduleOptions
from datacentric.train.config_schema import (
    ConfigError,
    coerce,
    field_types,
    setting,
    suggest,
    toml_value,
)

Policy = Literal[
    "static",
    "static-reference",
    "packed",
    "dcp-intra",
    "dcp-inter",
    "dcp-pac",
    "megatron-dyncp",
    "dcp-opt",
]


@dataclass(kw_only=True)
class JobConfig:
    out: str = "runs/train"
    """Run folder: resolved config, metrics.jsonl, samples.jsonl, checkpoints, schedules."""
    seed: int = 0
    """Seed of model initialisation, data noise and the schedule."""
    overwrite: bool = False
    """Replace the run already in ``out`` (its checkpoints, logs and schedules) instead of
    refusing."""


@dataclass(kw_only=True)
class ModelConfig:
    model: str = "llama"
    """Model preset name (``llama``, ``dit``, ...) or ``package.module:factory`` import path."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (``bfloat16``: autocast, CUDA only)."""


@dataclass(kw_only=True)
class DataConfig:
    dataset: str = "stdlib"
    """``stdlib``, a workload preset, ``jsonl:``/``parquet:``/``text:PATH_OR_GLOB``,
    ``hf-datasets:DIR``, ``latents:DIR`` or ``package.module:factory`` (docs/data.md)."""
    dataset_limit: int | None = setting(None, ge=1)
    """Use only the first N samples of the dataset (unset: all of it)."""
    max_tokens: int = setting(4096, ge=1)
    """Longest text sample in tokens; longer documents follow ``long_docs``."""
    tokenizer: str | None = None
    """Text datasets: a local ``tokenizer.json`` (unset: UTF-8 bytes, vocabulary 256)."""
    text_field: str = "text"
    """Text datasets: the JSON key or column holding each document's text."""
    long_docs: Literal["chunk", "truncate", "skip", "error"] = "chunk"
    """Documents longer than ``max_tokens``: split into near-equal chunks, truncate, skip
    or fail."""
    bucket_config: str | None = None
    """Latent datasets: Open-Sora-style bucket config, JSON (unset: every latent its own shape)."""


@dataclass(kw_only=True)
class TrainingConfig:
    lr: float = setting(3e-3, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = setting(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = setting(1.0, ge=0)
    """Gradient clipping max norm (0: off); applied after the once-per-step gradient sync."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule after the linear warm-up; its horizon is this command's step count."""
    warmup_iterations: int = setting(2, ge=0)
    """Warm-up optimizer steps of the learning-rate schedule."""
    epochs: int = setting(1, ge=1)
    """Epochs over the dataset."""
    iterations: int | None = setting(None, ge=1)
    """Stop after this many optimizer steps counted from the run's start (unset: all epochs)."""
    lr_horizon: Literal["extend", "first"] = "extend"
    """Learning-rate horizon of a resumed run: ``extend``: this command's step count (its
    ``iterations``, else its ``epochs``), so a longer resume stretches the schedule;
    ``first``: the horizon the run started with (steps past it run at the minimum rate)."""
    compile: bool = False
    """Compile each transformer block's forward with ``torch.compile`` (inductor; the first
    steps pay the compilation, docs/runtime.md)."""
    fault_inject: str | None = None
    """Tests only: ``RANK:ITERATION`` kills that rank in that step (once per run folder);
    ``RANK:ITERATION:hang`` stalls it; ``RANK:ITERATION:term`` sends SIGTERM to its process
    group; ``RANK:STEP:stop`` SIGSTOPs it inside the checkpoint save of step STEP."""


@dataclass(kw_only=True)
class ParallelismConfig:
    world: int | None = setting(None, ge=1)
    """Local ranks to start (gloo on CPU, one GPU each with CUDA); unset: torchrun's ranks or one
    process."""
    collective_timeout_s: float = setting(300.0, gt=0)
    """Seconds a collective may wait before the run fails with the rank and operation named."""
    shard: Literal["none", "ddp", "fsdp2"] = DEFAULT_SHARD
    """How model state is held across ranks: ``none`` (plain module, one all-reduce after
    backward), ``ddp``, or ``fsdp2`` (optimizer state sharded); docs/runtime.md."""
    reshard_after_forward: bool = False
    """FSDP2: free gathered parameters after every forward (needs equal micro-batch counts)."""
    device: str | None = None
    """Device of a single process: ``cuda``, ``cuda:N`` or ``cpu`` (unset: cuda when available)."""


@dataclass(kw_only=True)
class CheckpointConfig:
    checkpoint_every: int = setting(0, ge=0)
    """Save a checkpoint every K optimizer steps (0: only at the end)."""
    resume: bool = False
    """Continue the run in ``out`` from its newest valid checkpoint (a fresh start if it
    has none)."""
    resume_from: str | None = None
    """Continue from this checkpoint: a folder ``.../checkpoints/step-N`` or a step number of
    ``out``."""
    keep_last: int | None = setting(None, ge=1)
    """Keep only the newest N checkpoints (unset: keep all)."""
    expect_sha256: str | None = None
    """Resume only if the checkpoint's ``manifest.json`` has this SHA-256 (printed at save
    time and by ``datacentric inspect``); checked before anything else in it is read."""
    save_on_signal: bool = True
    """On SIGTERM/SIGINT, finish the step on every rank, save a checkpoint and exit with
    128+signal (preempted); off: stop at once without saving."""


@dataclass(kw_only=True)
class MetricsConfig:
    progress: bool = True
    """Show a progress bar on rank 0."""
    timeline: bool = False
    """Record every rank's micro-batch start/duration per step in metrics.jsonl (one small gather
    per step)."""


@dataclass(kw_only=True)
class ProfilingConfig:
    cost_model: Literal["profile", "analytic"] = "profile"
    """``profile``: the dual-layer profile measured on this run's ranks (reused from
    ``profile_dir`` when its fingerprint matches); ``analytic``: FLOP/byte model."""
    profile_dir: str | None = None
    """Where the profile is kept (unset: ``<out>/profile``); share it between runs."""
    memory_gb: float | None = setting(None, gt=0)
    """Memory cap per rank in GiB for planning (unset: 70% of device memory)."""


@dataclass(kw_only=True)
class SchedulingConfig:
    policy: Policy = "dcp-opt"
    """Scheduling policy (docs/scheduling.md)."""


#: ProfileSettings fields a run chooses (model, world, dtype, seed, progress and the
#: clock come from the other sections and the device).
PROFILE_FIELDS = ("warmup", "repeats", "threads_per_rank", "timeout_s", "interleave")


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


ProfileSettingsConfig = _section_from(ProfileSettings, PROFILE_FIELDS, "ProfileSettingsConfig")
ScheduleOptionsConfig = _section_from(ScheduleOptions, None, "ScheduleOptionsConfig")

#: Section name -> the classes whose fields it holds, in file order.
SECTIONS: dict[str, tuple[type, ...]] = {
    "job": (JobConfig,),
    "model": (ModelConfig,),
    "data": (DataConfig,),
    "training": (TrainingConfig,),
    "parallelism": (ParallelismConfig,),
    "checkpoint": (CheckpointConfig,),
    "metrics": (MetricsConfig,),
    "profiling": (ProfilingConfig, ProfileSettingsConfig),
    "scheduling": (SchedulingConfig, ScheduleOptionsConfig),
}


@dataclass(kw_only=True)
class TrainConfig(
    ScheduleOptionsConfig,
    SchedulingConfig,
    ProfileSettingsConfig,
    ProfilingConfig,
    MetricsConfig,
    CheckpointConfig,
    ParallelismConfig,
    TrainingConfig,
    DataConfig,
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
        from datacentric.train.config_schema import field_docs

        docs = field_docs(TrainConfig)
        lines: list[str] = []
        for section, keys in section_keys().items():
            lines.append(f"[{section}]")
            for key in keys:
                lines.append(f"# {docs.get(key, '')}")
                value = getattr(self, key)
                shown = "(unset)" if value is None else toml_value(value)
                lines.append(f"{'# ' if value is None else ''}{key} = {shown}")
            lines.append("")
        return "\n".join(lines)

    def schedule_options(self) -> ScheduleOptions:
        """The ``[scheduling]`` options as :class:`ScheduleOptions`."""
        names = [f.name for f in dataclasses.fields(ScheduleOptions)]
        return ScheduleOptions(**{n: getattr(self, n) for n in names})

    def profile_settings(self) -> dict[str, Any]:
        """The ``[profiling]`` fields of :class:`ProfileSettings` this run chooses."""
        return {n: getattr(self, n) for n in PROFILE_FIELDS}


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
            if key not in keys_of[name]:
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
        sharding(config)
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
    if config.warmup < 2:
        raise ConfigError(f"profiling.warmup: must be >= 2, got {config.warmup}")
    if config.repeats < 1:
        raise ConfigError(f"profiling.repeats: must be >= 1, got {config.repeats}")
    if config.timeout_s <= 0:
        raise ConfigError(f"profiling.timeout_s: must be > 0, got {config.timeout_s}")


def sharding(config: TrainConfig) -> ShardingSpec:
    """The run's ``shard`` setting (raises ``ValueError`` for a bad one)."""
    return ShardingSpec(config.shard, config.reshard_after_forward)


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
            f"training.fault_inject: must be 'RANK:ITERATION' or 'RANK:ITERATION:hang|term|stop' "
            f"(e.g. '1:3'), got {spec!r}"
        ) from None
    return rank, iteration, mode
