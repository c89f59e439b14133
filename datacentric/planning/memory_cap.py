"""The one memory budget per rank: resolved once, at the entry point, from the
``memory_gb`` setting and the device.

The planner writes it into the :class:`~datacentric.planning.plan.Plan`
(``memory_cap_bytes``), ``build_schedule`` copies it onto the
:class:`~datacentric.schedule.Schedule`, and the scheduler, the simulator and the
reports read it there. The 70% default is
:data:`~datacentric.settings.sections.DEFAULT_MEMORY_FRACTION`, written once.
"""

from __future__ import annotations

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
