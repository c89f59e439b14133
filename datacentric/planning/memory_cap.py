"""The one memory budget per rank: resolved once, at the entry point, from the
``memory_gb`` setting and the device.

The planner writes it into the :class:`~datacentric.planning.plan.Plan`
(``memory_cap_bytes``), ``build_schedule`` copies it onto the
:class:`~datacentric.schedule.Schedule`, and the scheduler, the simulator and the
reports read it there. Cost models only price memory; they hold no budget. The 70%
default is :data:`~datacentric.settings.sections.DEFAULT_MEMORY_FRACTION`, written once.
"""

from __future__ import annotations

import warnings

from datacentric.planning.hardware import gib_to_bytes
from datacentric.settings.sections import DEFAULT_MEMORY_FRACTION


def resolve_memory_cap(
    memory_gb: float | None,
    device_memory_bytes: int | None,
    fraction: float = DEFAULT_MEMORY_FRACTION,
) -> int:
    """Bytes a rank may use: ``memory_gb`` GiB when set, else ``fraction`` of the
    device's memory. Raises ``ValueError`` when neither is known."""
    if memory_gb is not None:
        if memory_gb <= 0:
            raise ValueError(f"memory_gb must be > 0, got {memory_gb}")
        return int(gib_to_bytes(memory_gb))
    if not 0 < fraction <= 1:
        raise ValueError(f"the memory fraction must be in (0, 1], got {fraction}")
    if device_memory_bytes is None:
        raise ValueError("no memory budget: set memory_gb (the device's memory is unknown)")
    return int(fraction * device_memory_bytes)


def device_memory_of(cost_model: object) -> int | None:
    """The memory of the device a cost model prices: an analytic model's hardware
    preset (``None`` when the model names no hardware, as a fitted one)."""
    memory = getattr(getattr(cost_model, "hardware", None), "memory_bytes", None)
    return None if memory is None else int(memory)


def warn_cost_model_cap(what: str) -> None:
    """The deprecation warning of a cost model's memory cap (``memory_fraction``,
    ``memory_capacity_bytes``, ``memory_gb`` of a cost-model factory)."""
    warnings.warn(
        f"{what} is deprecated: cost models only price memory; the budget is the plan's "
        "(resolve_memory_cap(memory_gb, device memory) -> Pipeline(memory_cap_bytes=...) "
        "or plan_buckets(memory_cap_bytes=...))",
        DeprecationWarning,
        stacklevel=3,
    )
