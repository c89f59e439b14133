"""Typed configuration of a training run, from a TOML file and/or command-line flags.

Every field has a one-line docstring in the ``# `` comment above it; unknown keys
are an error that names them and lists the valid ones (a typo never silently
falls back to a default).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec


@dataclass(kw_only=True)
class TrainConfig:
    """A training run's settings (written resolved into ``<out>/config.json``)."""

    # Model preset name (``llama``, ``dit``, ...) or ``package.module:factory`` import path.
    model: str = "llama"
    # Dataset: ``stdlib``, a workload preset, ``jsonl:``/``parquet:``/``text:PATH_OR_GLOB``,
    # ``hf-datasets:DIR``, ``latents:DIR`` or ``package.module:factory`` (docs/data.md).
    dataset: str = "stdlib"
    # Use only the first N samples of the dataset (None: all of it).
    dataset_limit: int | None = None
    # Longest text sample in tokens; longer files are split into chunks of this size.
    max_tokens: int = 4096
    # Text datasets: a local ``tokenizer.json`` (None: UTF-8 bytes, vocabulary 256).
    tokenizer: str | None = None
    # Text datasets: the JSON key or column holding each document's text.
    text_field: str = "text"
    # Over-long documents: ``chunk`` (near-equal chunks), ``truncate``, ``skip`` or ``error``.
    long_docs: str = "chunk"
    # Latent datasets: Open-Sora-style bucket config, JSON (None: every latent its own shape).
    bucket_config: str | None = None
    # Scheduling policy (static, packed, dcp-intra, dcp-inter, dcp-pac, megatron-dyncp, dcp-opt).
    policy: str = "dcp-opt"
    # Cost model: ``profile`` (dual-layer profile measured in this run, or reused from
    # ``profile_dir`` when its fingerprint matches) or ``analytic`` (FLOP/byte model).
    cost_model: str = "profile"
    # Where the profile is kept (None: ``<out>/profile``); share it between runs.
    profile_dir: str | None = None
    # Memory cap per rank in GiB for planning (None: 70% of device memory).
    memory_gb: float | None = None
    # Upper bound on tokens per optimizer step over the whole world (None: the policy's default).
    tokens_per_iteration: int | None = None
    # Peak learning rate of AdamW.
    lr: float = 3e-3
    # AdamW weight decay.
    weight_decay: float = 0.0
    # AdamW betas.
    betas: tuple[float, float] = (0.9, 0.95)
    # Gradient clipping max norm (None or 0: off). Applied after the once-per-step sync.
    grad_clip: float | None = 1.0
    # Learning-rate schedule: ``constant`` or ``cosine`` (with linear warm-up).
    lr_schedule: str = "cosine"
    # Warm-up optimizer steps of the learning-rate schedule.
    warmup_iterations: int = 2
    # Seed of model initialisation, data noise and the schedule.
    seed: int = 0
    # Epochs over the dataset.
    epochs: int = 1
    # Stop after this many optimizer steps counted from the run's start (None: all epochs).
    iterations: int | None = None
    # Run folder: resolved config, metrics.jsonl, checkpoints, traces.
    out: str = "runs/train"
    # Save a checkpoint every K optimizer steps (0: only at the end).
    checkpoint_every: int = 0
    # Resume from the latest checkpoint in ``out`` if there is one.
    resume: bool = False
    # Compute dtype: ``float32`` or ``bfloat16`` (autocast; CUDA only).
    dtype: str = "float32"
    # Seconds a collective may wait before the run fails with the rank and operation named.
    collective_timeout_s: float = 300.0
    # Fault injection (off: None): ``RANK:ITERATION`` kills that rank at the start of that
    # step (once per run folder); ``RANK:ITERATION:hang`` makes it stop answering instead.
    fault_inject: str | None = None
    # Record every rank's micro-batch start/duration per step in metrics.jsonl (one
    # extra small gather per step; for traces and Gantt charts of measured runs).
    timeline: bool = False
    # Show a progress bar on rank 0.
    progress: bool = True
    # How model state is held across ranks: ``none`` (plain module, one all-reduce after
    # backward), ``ddp`` or ``fsdp2`` (optimizer state sharded); docs/runtime.md.
    shard: str = DEFAULT_SHARD
    # FSDP2: free gathered parameters after every forward (needs equal micro-batch counts).
    reshard_after_forward: bool = False
    # Device of a single process: ``cuda``, ``cuda:N`` or ``cpu`` (None: cuda when available).
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def check_keys(values: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming unknown keys (with close matches) in ``values``."""
    valid = field_names()
    unknown = [k for k in values if k not in valid]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, valid, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"{where}: unknown configuration keys {', '.join(hints)}; valid keys: "
            f"{', '.join(valid)}"
        )


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Build a config from a TOML file (optional) and then keyword overrides.

    Overrides whose value is ``None`` are ignored so that unset CLI flags keep the
    file's (or default) value.
    """
    values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
        data = data.get("train", data)
        check_keys(data, str(path))
        values.update(data)
    given = {k: v for k, v in overrides.items() if v is not None}
    check_keys(given, "command line")
    values.update(given)
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    config = TrainConfig(**values)
    validate(config)
    return config


def validate(config: TrainConfig) -> None:
    """Clear errors for settings that cannot work."""
    if config.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {config.lr_schedule!r}")
    if config.cost_model not in ("profile", "analytic"):
        raise ValueError(f"cost_model must be 'profile' or 'analytic', got {config.cost_model!r}")
    if config.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {config.dtype!r}")
    if config.iterations is not None and config.iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {config.iterations}")
    if config.epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {config.epochs}")
    if config.memory_gb is not None and config.memory_gb <= 0:
        raise ValueError(f"memory_gb must be positive, got {config.memory_gb}")
    if config.fault_inject is not None:
        parse_fault(config.fault_inject)
    sharding(config)
    if config.device is not None and config.device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {config.device!r}")


def sharding(config: TrainConfig) -> ShardingSpec:
    """The run's ``shard`` setting (raises ``ValueError`` for a bad one)."""
    return ShardingSpec(config.shard, config.reshard_after_forward)


def parse_fault(spec: str) -> tuple[int, int, str]:
    """``RANK:ITERATION[:kill|hang]`` -> (rank, iteration, mode)."""
    parts = spec.split(":")
    mode = parts[2] if len(parts) == 3 else "kill"
    try:
        if len(parts) not in (2, 3) or mode not in ("kill", "hang"):
            raise ValueError
        rank, iteration = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(
            f"fault_inject must be 'RANK:ITERATION' or 'RANK:ITERATION:hang' (e.g. '1:3'), "
            f"got {spec!r}"
        ) from None
    return rank, iteration, mode
