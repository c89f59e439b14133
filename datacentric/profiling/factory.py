"""One factory for every cost model: analytic on a hardware preset (the calibrated
``cpu-local`` included), and fitted to a measured profile.

A memory cap given in GiB becomes the model's ``memory_capacity_bytes`` here, through
:func:`~datacentric.planning.hardware.gib_to_bytes` (the one conversion), so that the
plan, the scheduler and the simulator all see one cap.
"""

from __future__ import annotations

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.fitted import FittedCostModel
from datacentric.planning.hardware import Hardware, get_hardware, gib_to_bytes, load_hardware_file
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.profiling.preset_specs import get_model_spec
from datacentric.profiling.store import Profile
from datacentric.settings.sections import DEFAULT_MEMORY_FRACTION

#: Deprecated alias of :data:`datacentric.settings.sections.DEFAULT_MEMORY_FRACTION`.
MEMORY_FRACTION = DEFAULT_MEMORY_FRACTION


def analytic_cost_model(
    model: str | ModelSpec,
    hardware: str | Hardware,
    *,
    memory_gb: float | None = None,
    memory_fraction: float = MEMORY_FRACTION,
    dtype_bytes: int | None = None,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    grad_sync_overlap: float = 0.0,
) -> AnalyticCostModel:
    """The analytic model of ``model`` (a preset name or a spec) on ``hardware`` (a
    preset name, ``cpu-local`` being calibrated on this machine, a calibrated ``.json``
    file, or constants).

    ``memory_gb`` caps each rank (GiB); otherwise ``memory_fraction`` of the device.
    ``dtype_bytes`` defaults to 4 (fp32) on ``cpu-local`` and 2 (bf16) elsewhere.
    ``shard`` on ``world_size`` ranks: how model state is held (a
    :class:`~datacentric.planning.sharding.ShardingSpec` or its mode; default
    :data:`~datacentric.planning.sharding.DEFAULT_SHARD`). ``grad_sync_overlap``: share
    of the gradient reduction hidden behind backward (0: the model reports all of it).
    """
    spec = get_model_spec(model) if isinstance(model, str) else model
    hw = resolve_hardware(hardware)
    if dtype_bytes is None:
        dtype_bytes = 4 if hw.name == "cpu-local" else 2
    sharding = shard if isinstance(shard, ShardingSpec) else ShardingSpec(shard or DEFAULT_SHARD)
    return AnalyticCostModel(
        spec,
        hw,
        memory_fraction=memory_fraction,
        dtype_bytes=dtype_bytes,
        sharding=sharding,
        world_size=world_size,
        grad_sync_overlap=grad_sync_overlap,
        memory_capacity_bytes=gib_to_bytes(memory_gb),
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
    """The model fitted to ``profile``'s points, capped at ``memory_gb`` GiB per rank,
    else at ``default_cap_bytes`` (a saved plan's cap, or the device's)."""
    cap = gib_to_bytes(memory_gb)
    if cap is None:
        if default_cap_bytes is None:
            raise ValueError("a fitted cost model needs a memory cap: give memory_gb")
        cap = default_cap_bytes
    return FittedCostModel(
        profile.points,
        num_blocks=profile.num_blocks,
        attention_kind=profile.attention_kind,
        memory_capacity_bytes=cap,
        gpus_per_node=profile.gpus_per_node,
        grad_sync_seconds=profile.grad_sync_seconds,
    )
