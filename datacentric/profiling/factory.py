"""One factory for every cost model: analytic on a hardware preset (the calibrated
``cpu-local`` included), and fitted to a measured profile.

Cost models only price memory: the budget a plan fits under is resolved at the entry
point (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`) and held by the plan.
"""

from __future__ import annotations

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.fitted import FittedCostModel
from datacentric.planning.hardware import Hardware, get_hardware, load_hardware_file
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.profiling.module_specs import named_spec
from datacentric.profiling.store import Profile


def analytic_cost_model(
    model: str | ModelSpec,
    hardware: str | Hardware,
    *,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
) -> AnalyticCostModel:
    """The analytic model of ``model`` (a preset name or a spec) on ``hardware`` (a
    preset name, ``cpu-local`` being calibrated on this machine, a calibrated ``.json``
    file, or constants).

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
    return AnalyticCostModel(
        spec,
        hw,
        dtype_bytes=dtype_bytes,
        sharding=sharding,
        world_size=world_size,
        grad_sync_overlap=grad_sync_overlap,
    )


def resolve_hardware(hardware: str | Hardware) -> Hardware:
    """A preset name, a ``.json`` file ``datacentric calibrate --out`` wrote, or constants."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware.endswith(".json"):
        return load_hardware_file(hardware)
    return get_hardware(hardware)


def fitted_cost_model(profile: Profile) -> FittedCostModel:
    """The model fitted to ``profile``'s points."""
    return FittedCostModel(
        profile.points,
        num_blocks=profile.num_blocks,
        attention_kind=profile.attention_kind,
        gpus_per_node=profile.gpus_per_node,
        grad_sync_seconds=profile.grad_sync_seconds,
    )
