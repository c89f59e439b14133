"""Build a run's dataset, model and cost model from its configuration."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import torch
from torch import nn

from datacentric.data.base import Dataset
from datacentric.data.sources import data_settings, open_dataset
from datacentric.models.presets import MODEL_PRESETS, build_model
from datacentric.planning.cost_model import CostModel
from datacentric.planning.memory_cap import resolve_memory_cap
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.autoprofile import ensure_profile
from datacentric.profiling.factory import analytic_cost_model, fitted_cost_model
from datacentric.profiling.preset_specs import spec_from_model_preset
from datacentric.profiling.profiler import ProfileSettings
from datacentric.train.config import TrainConfig, sharding


def build_dataset(config: TrainConfig) -> Dataset:
    """The run's dataset (see :func:`datacentric.data.sources.open_dataset`)."""
    return open_dataset(config.dataset, data_settings(config))


def build_model_for(config: TrainConfig, dataset) -> nn.Module:
    """A model preset by name, or ``package.module:factory`` (called with no arguments).

    Seed the global RNG first: every rank must build identical weights.
    """
    name = config.model
    dtype = torch.float32
    if name in MODEL_PRESETS:
        overrides = {}
        token_dim = getattr(dataset, "token_dim", None)
        if token_dim is not None:
            overrides["in_channels"] = token_dim
        vocab_size = getattr(dataset, "vocab_size", None)
        preset_vocab = getattr(MODEL_PRESETS[name].config, "vocab_size", None)
        if vocab_size and preset_vocab is not None and vocab_size > preset_vocab:
            overrides["vocab_size"] = vocab_size  # a tokenizer larger than the preset's
        return build_model(name, dtype=dtype, **overrides)
    if ":" in name:
        module_name, factory = name.split(":", 1)
        model = getattr(importlib.import_module(module_name), factory)()
        missing = [
            a
            for a in ("blocks", "set_attention", "num_heads", "loss_mode")
            if not hasattr(model, a)
        ]
        if missing:
            raise TypeError(
                f"model {name!r} lacks {', '.join(missing)}; a datacentric model needs "
                "blocks, set_attention(fn), num_heads, loss_mode and forward(batch) -> "
                "per-token loss (see docs/models.md)"
            )
        return model
    raise ValueError(
        f"unknown model {name!r}; use a preset ({', '.join(MODEL_PRESETS)}) or "
        "'package.module:factory'"
    )


def build_cost_model(
    model: str | ModelSpec,
    device: torch.device,
    dtype: str = "float32",
    memory_gb: float | None = None,
    *,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
) -> CostModel:
    """The cost model a schedule is planned with, for model preset ``model`` (or a spec,
    e.g. :func:`~datacentric.planning.config_specs.spec_from_config` of a transformers
    or diffusers config).

    Analytic FLOP/byte model of the model on this device: ``cpu-local`` (calibrated
    on a CPU) or ``h100-sxm``/``h200-sxm`` by the CUDA device's name; ``memory_gb``
    caps each rank (default: 70% of the device); model state is held as ``shard``
    says on ``world_size`` ranks.
    """
    if isinstance(model, str) and model not in MODEL_PRESETS:
        raise ValueError(
            f"model {model!r} has no analytic spec; pass a cost model, or profile it first "
            "(`datacentric profile`)"
        )
    return analytic_cost_model(
        model if isinstance(model, ModelSpec) else spec_from_model_preset(model),
        _hardware_name(device),
        memory_gb=memory_gb,
        dtype_bytes=2 if dtype == "bfloat16" else 4,
        shard=shard,
        world_size=world_size,
    )


def run_cost_model(
    config: TrainConfig, world_size: int, device: torch.device, shapes, *, is_main: bool = True
) -> CostModel:
    """The cost model of a training run (collective when it profiles).

    ``profile``: the dual-layer profile in ``profile_dir`` (default ``<out>/profile``)
    if its fingerprint matches this model, device, torch, world and dtype, else one
    measured now on the run's own ranks (no second launch) and saved there; the
    fitted model then predicts every bucket. ``analytic``: :func:`build_cost_model`.
    """
    if config.cost_model == "analytic":
        return build_cost_model(
            config.model,
            device,
            config.dtype,
            config.memory_gb,
            shard=sharding(config),
            world_size=world_size,
        )
    directory = config.profile_dir or str(Path(config.out) / "profile")
    settings = ProfileSettings(
        model=config.model,
        world_size=world_size,
        backend="nccl" if device.type == "cuda" else "gloo",
        dtype=config.dtype,
        seed=config.seed,
        progress=config.progress and is_main,
        # Wall time: the schedule (and the simulator checked against this run) predict
        # wall-clock steps, collective waits included.
        clock="wall",
        **config.profile_settings(),
    )
    profile = ensure_profile(directory, settings, shapes)
    return fitted_cost_model(
        profile, memory_gb=config.memory_gb, default_cap_bytes=_device_capacity(device)
    )


def _device_capacity(device: torch.device) -> int:
    """The default budget on ``device`` (the settings' share of its memory)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return resolve_memory_cap(None, total)


def _hardware_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-local"
    name = torch.cuda.get_device_name(device).lower()
    return "h200-sxm" if "h200" in name else "h100-sxm"
