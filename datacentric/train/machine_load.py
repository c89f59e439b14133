"""How busy this machine was while something was timed.

On a machine shared with other jobs a measured time says as much about the other jobs
as about the code, so every measured comparison records the load beside its numbers:
the load average before and after, and the CPU time its ranks got against the wall
time they ran (a rank that waits for a core shows wall time without CPU time).

The verdict :attr:`LoadReading.under_load` is a rule of thumb, approximate by nature:
the 1-minute load average of the *other* jobs above :data:`BUSY_LOAD_PER_CORE` per core
(before the run; after it, less the ranks' own load), or the ranks getting less than
:data:`MIN_CPU_SHARE` of their wall time as CPU time. A rank also shows wall time without
CPU time while it waits for another rank in a collective, so an idle machine's share
stays somewhat below 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: Other jobs' 1-minute load average per core above which a machine counts as busy.
BUSY_LOAD_PER_CORE = 0.5
#: CPU time per rank-second of wall time below which the ranks count as starved of cores.
MIN_CPU_SHARE = 0.75


def cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages (zeros where the OS has none)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)
    return (one, five, fifteen)


def busy(load_1m: float, num_cores: int) -> bool:
    """Whether other jobs' 1-minute load average makes timings on ``num_cores`` noisy."""
    return load_1m > BUSY_LOAD_PER_CORE * num_cores


@dataclass(frozen=True)
class LoadReading:
    """The machine's load around a measured run, and the CPU time its ranks got."""

    cores: int
    """Cores this process may run on."""
    ranks: int
    """Processes that ran the measured work at once."""
    before: tuple[float, float, float]
    """Load averages (1, 5, 15 minutes) before the run."""
    after: tuple[float, float, float]
    """Load averages after the run (they include the ranks' own load)."""
    rank_cpu_s: float
    """CPU seconds all ranks got, summed over ranks."""
    rank_wall_s: float
    """Wall seconds the ranks ran, summed over ranks."""

    @property
    def cpu_share(self) -> float:
        """CPU time per second of wall time, per rank (1.0: every rank always ran)."""
        return self.rank_cpu_s / self.rank_wall_s if self.rank_wall_s > 0 else 0.0

    @property
    def others_load(self) -> float:
        """Other jobs' 1-minute load average: before the run, or after it less the ranks
        (each rank counted as one runnable process: a lower bound on the others')."""
        return max(self.before[0], self.after[0] - self.ranks)

    @property
    def under_load(self) -> bool:
        """Whether the run was made on a busy machine (module docstring: the rule)."""
        return busy(self.others_load, self.cores) or self.cpu_share < MIN_CPU_SHARE

    def describe(self) -> str:
        """One line: load before and after, the ranks' CPU share, and the verdict."""
        verdict = (
            "UNDER LOAD: other jobs shared the cores, timings are noisy"
            if self.under_load
            else "the machine was otherwise idle"
        )
        return (
            f"load average {self.before[0]:.2f} before, {self.after[0]:.2f} after on "
            f"{self.cores} cores; the {self.ranks} ranks got {self.cpu_share:.0%} of their "
            f"wall time as CPU time ({self.rank_cpu_s:.0f} of {self.rank_wall_s:.0f} "
            f"rank-seconds): {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "ranks": self.ranks,
            "before": list(self.before),
            "after": list(self.after),
            "rank_cpu_s": self.rank_cpu_s,
            "rank_wall_s": self.rank_wall_s,
            "cpu_share": self.cpu_share,
            "under_load": self.under_load,
        }


def describe_start(before: tuple[float, float, float], num_cores: int) -> str:
    """The load before a run, for its first line (the CPU share is known only after)."""
    note = (
        ": BUSY, other jobs share the cores and timings will be noisy"
        if busy(before[0], num_cores)
        else ""
    )
    return f"load average {before[0]:.2f} on {num_cores} cores{note}"
