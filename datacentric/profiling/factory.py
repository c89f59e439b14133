"""Cost models by name: the analytic model of a named model on a named hardware preset
(the calibrated ``cpu-local`` included; made by
:func:`~datacentric.planning.analytic.analytic_model`, which a run calls itself with the
spec read off its built model), the model fitted to a measured profile, and the model a
name means, for the analytic model's spec.

Cost models only price memory: the budget a plan fits under is resolved at the entry
point (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`) and held by the plan.

A name's spec (:func:`named_spec`, the one lookup; :func:`get_model_spec` for the
analytic presets) is derived by :mod:`datacentric.planning.spec_derivation`, the one
derivation; this module only finds what it reads: an analytic preset, a runnable
preset's config (no torch), the run's built model, or the model built on the meta
device (no memory, no weights read).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from datacentric.models.configs import MODEL_PRESETS, model_config
from datacentric.planning.analytic import AnalyticCostModel, analytic_model
from datacentric.planning.fitted import FittedCostModel
from datacentric.planning.hardware import Hardware, resolve_hardware
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import ShardingSpec
from datacentric.planning.spec_derivation import (
    HAND_PRESETS,
    spec_from_model_config,
    spec_of_model,
    with_trainable,
)
from datacentric.profiling.store import Profile

if TYPE_CHECKING:  # the presets' specs need no torch; building a model does
    from torch import nn

    from datacentric.models.lora import LoraSpec


def analytic_cost_model(
    model: str | ModelSpec,
    hardware: str | Hardware,
    *,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
) -> AnalyticCostModel:
    """The analytic model of ``model`` (a name, :func:`named_spec`, or a spec) on
    ``hardware`` (a preset name, ``cpu-local`` being calibrated on this machine, a
    calibrated ``.json`` file, or constants:
    :func:`~datacentric.planning.hardware.resolve_hardware`), as
    :func:`~datacentric.planning.analytic.analytic_model` reads the other settings."""
    return analytic_model(
        named_spec(model) if isinstance(model, str) else model,
        resolve_hardware(hardware),
        dtype_bytes=dtype_bytes,
        shard=shard,
        world_size=world_size,
        grad_sync_overlap=grad_sync_overlap,
    )


def fitted_cost_model(profile: Profile) -> FittedCostModel:
    """The model fitted to ``profile``'s points."""
    return FittedCostModel(
        profile.points,
        num_blocks=profile.num_blocks,
        attention_kind=profile.attention_kind,
        gpus_per_node=profile.gpus_per_node,
        grad_sync_seconds=profile.grad_sync_seconds,
    )


# --- the model a name means, for its spec ------------------------------------------------
def list_model_specs() -> list[str]:
    """Names of the analytic model presets (the hand-written ones and the runnable
    presets)."""
    return sorted({*HAND_PRESETS, *MODEL_PRESETS})


@cache
def get_model_spec(name: str) -> ModelSpec:
    """The analytic model preset called ``name`` (a runnable preset's from its config,
    without building the model)."""
    if name in HAND_PRESETS:
        return HAND_PRESETS[name]()
    if name in MODEL_PRESETS:
        return spec_from_model_config(model_config(name), name)
    raise KeyError(f"unknown model {name!r}; choose one of {list_model_specs()}")


def named_spec(
    name: str,
    model_args: Mapping[str, Any] | None = None,
    lora: LoraSpec | None = None,
    *,
    module: nn.Module | None = None,
) -> ModelSpec:
    """The spec of the model ``name`` means, the one place a model's spec is found: an
    analytic preset (:func:`get_model_spec`, e.g. ``llama-7b``) when it names one with no
    model arguments and no adapters, else read from the model: the built ``module`` when
    the caller has it (:func:`~datacentric.planning.spec_derivation.spec_of_model`),
    else the model built on the meta device (no memory, no weights read). ``lora``: only
    its adapters train (their count read from the model built on the meta device with
    them, or from ``module``, which then carries them)."""
    args_json = json.dumps(dict(model_args or {}), sort_keys=True)
    preset = name in list_model_specs() and args_json == "{}"
    if module is not None and not (preset and lora is None):
        return spec_of_model(module, name)
    if preset and lora is None:
        return get_model_spec(name)
    return _built_spec(name, args_json, lora, preset)


def run_spec(
    name: str,
    model: nn.Module | None = None,
    model_args: Mapping[str, Any] | None = None,
    lora: LoraSpec | None = None,
) -> ModelSpec:
    """The spec a run of ``--model name`` prices: :func:`named_spec` read off the built
    ``model`` when the run has one."""
    return named_spec(name, model_args, lora, module=model)


@cache
def _built_spec(name: str, args_json: str, lora: LoraSpec | None, preset: bool) -> ModelSpec:
    """The spec of the model ``name`` means, built once on the meta device (no memory,
    no weights read): read off the model (an analytic preset's own spec stands for it),
    then, with ``lora``, the adapters injected into the same model to count what trains
    (they change nothing else the spec holds)."""
    from datacentric.models.lora import apply_lora
    from datacentric.models.source import build_model_named

    model = build_model_named(name, json.loads(args_json), device="meta")
    spec = get_model_spec(name) if preset else spec_of_model(model, name)
    if lora is None:
        return spec
    apply_lora(model, lora)
    return with_trainable(spec, model)
