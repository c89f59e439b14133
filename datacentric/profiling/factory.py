"""One factory for every cost model: analytic on a hardware preset (the calibrated
``cpu-local`` included), and fitted to a measured profile.

Cost models only price memory: the budget a plan fits under is resolved at the entry
point (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`) and held by the plan.
"""

from __future__ import annotations

import warnings

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.fitted import FittedCostModel
from datacentric.planning.hardware import Hardware, get_hardware, gib_to_bytes, load_hardware_file
from datacentric.planning.memory_cap import resolve_memory_cap, warn_cost_model_cap
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.profiling.module_specs import named_spec
from datacentric.profiling.store import Profile
from datacentric.settings.sections import DEFAULT_MEMORY_FRACTION

#: Deprecated alias of :data:`datacentric.settings.sections.DEFAULT_MEMORY_FRACTION`.
MEMORY_FRACTION = DEFAULT_MEMORY_FRACTION


def analytic_cost_model(
    model: str | ModelSpec,
    hardware: str | Hardware,
    *,
    memory_gb: float | None = None,
    memory_fraction: float | None = None,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
) -> AnalyticCostModel:
    """The analytic model of ``model`` (a preset name or a spec) on ``hardware`` (a
    preset name, ``cpu-local`` being calibrated on this machine, a calibrated ``.json``
    file, or constants).

    ``memory_gb`` and ``memory_fraction``: deprecated (the budget is the plan's).
    ``dtype_bytes`` defaults to 4 (fp32) on ``cpu-local`` and 2 (bf16) elsewhere.
    ``shard`` on ``world_size`` ranks: how model state is held (a
    :class:`~datacentric.planning.sharding.ShardingSpec` or its mode; default
    :data:`~datacentric.planning.sharding.DEFAULT_SHARD`). ``grad_sync_overlap``: share
    of the gradient reduction hidden behind backward (0: the model reports all of it).
    """
    spec = named_spec(model) if isinstance(model, str) else model
    hw = resolve_hardware(hardware)
    if dtype_bytes is None:
        dtype_bytes = 4 if hw.name == "cpu-local" else 2
    sharding = shard if isinstance(shard, ShardingSpec) else ShardingSpec(shard or DEFAULT_SHARD)
    legacy = {}
    if memory_gb is not None or memory_fraction is not None:
        warn_cost_model_cap("analytic_cost_model(memory_gb=, memory_fraction=)")
        fraction = {} if memory_fraction is None else {"fraction": memory_fraction}
        legacy["memory_capacity_bytes"] = resolve_memory_cap(memory_gb, hw.memory_bytes, **fraction)
    with warnings.catch_warnings():  # warned above, once
        warnings.simplefilter("ignore", DeprecationWarning)
        return AnalyticCostModel(
            spec,
            hw,
            dtype_bytes=dtype_bytes,
            sharding=sharding,
            world_size=world_size,
            grad_sync_overlap=grad_sync_overlap,
            **legacy,
        )


def resolve_hardware(hardware: str | Hardware) -> Hardware:
    """A preset name, a ``.json`` file ``datacentric calibrate --out`` wrote, or constants."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware.endswith(".json"):
        return load_hardware_file(hardware)
    return get_hardware(hardware)


def fitted_cost_model(
    profile: Profile, *, memory_gb: float | None = None, default_cap_bytes: int | None = None
) -> FittedCostModel:
    """The model fitted to ``profile``'s points. ``memory_gb`` and
    ``default_cap_bytes``: deprecated (the budget is the plan's)."""
    legacy = {}
    if memory_gb is not None or default_cap_bytes is not None:
        warn_cost_model_cap("fitted_cost_model(memory_gb=, default_cap_bytes=)")
        legacy["memory_capacity_bytes"] = gib_to_bytes(memory_gb) or default_cap_bytes
    with warnings.catch_warnings():  # warned above, once
        warnings.simplefilter("ignore", DeprecationWarning)
        return FittedCostModel(
            profile.points,
            num_blocks=profile.num_blocks,
            attention_kind=profile.attention_kind,
            gpus_per_node=profile.gpus_per_node,
            grad_sync_seconds=profile.grad_sync_seconds,
            **legacy,
        )
