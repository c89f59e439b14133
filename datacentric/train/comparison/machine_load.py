"""How busy this machine was while something was timed.

On a machine shared with other jobs a measured time says as much about the other jobs
as about the code, so every measured comparison records the load beside its numbers:
the load average before and after, and the CPU time its ranks got against the wall
time they ran (a rank that waits for a core shows wall time without CPU time).

Where the operating system counts each core's busy time (Linux ``/proc/stat``), the
other jobs' share is measured directly over the run (:class:`CpuClock`): the cores' busy
time less the CPU time this process and its ranks spent (each rank reports its whole
process's CPU time; what other helpers of ours spend, such as the fork server that
starts the ranks, counts as other jobs, a small overstatement). A load average looks back a
minute or more, so right after an earlier run of our own it still counts that run;
the direct reading does not. Elsewhere the load averages stand in.

The verdict :attr:`LoadReading.under_load` is a rule of thumb, approximate by nature:
other jobs keeping more than :data:`BUSY_CPU_PER_CORE` of each core busy during the
run (measured), or, where that cannot be measured, their 1-minute load average above
:data:`BUSY_LOAD_PER_CORE` per core (before the run; after it, less the ranks' own
load); or the ranks getting less than :data:`MIN_CPU_SHARE` of their wall time as CPU
time. A rank also shows wall time without CPU time while it waits for another rank in
a collective, so an idle machine's share stays somewhat below 1.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.progress import counted

#: Other jobs' 1-minute load average per core above which a machine counts as busy.
BUSY_LOAD_PER_CORE = 0.5
#: Other jobs' measured busy time per core and second above which a machine counts as busy.
BUSY_CPU_PER_CORE = 0.25
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


def busy_measured(others_cores: float, num_cores: int) -> bool:
    """Whether other jobs keeping ``others_cores`` cores busy (measured) make timings on
    ``num_cores`` noisy."""
    return others_cores > BUSY_CPU_PER_CORE * num_cores


STAT_FILE = Path("/proc/stat")
#: ``/proc/stat`` columns (after the name) that count a core as busy: user, nice,
#: system, irq, softirq, steal (idle and iowait are the others; guest time is already
#: inside user).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def cores_busy_s(stat_file: Path = STAT_FILE) -> float | None:
    """Busy seconds the cores this process may run on have spent since boot, summed
    over those cores; ``None`` where the OS does not count them."""
    try:
        lines = stat_file.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    ticks = 0
    found = False
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if allowed is not None and int(name[3:]) not in allowed:
            continue
        columns = rest.split()
        ticks += sum(int(columns[i]) for i in _BUSY_COLUMNS if i < len(columns))
        found = True
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def own_cpu_s() -> float:
    """CPU seconds this process has spent (its threads included, its children not:
    ranks started through a fork server are not its children to wait for, so they
    report their own, :meth:`CpuClock.others_cores`'s ``ours_s``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuClock:
    """One reading of the cores' busy time, this process tree's CPU time and the wall
    clock; two readings give the cores other jobs kept busy between them."""

    cores_busy_s: float | None
    own_s: float
    wall_s: float

    @staticmethod
    def now() -> CpuClock:
        return CpuClock(cores_busy_s(), own_cpu_s(), time.perf_counter())

    def others_cores(self, later: CpuClock, ours_s: float = 0.0) -> float | None:
        """Cores other jobs kept busy on average from this reading to ``later``, less
        this process and ``ours_s`` CPU seconds our ranks reported (``None`` where the
        OS does not count busy time)."""
        if self.cores_busy_s is None or later.cores_busy_s is None:
            return None
        elapsed = later.wall_s - self.wall_s
        if elapsed <= 0:
            return None
        busy = later.cores_busy_s - self.cores_busy_s
        others = busy - (later.own_s - self.own_s) - ours_s
        return max(0.0, others / elapsed)


def busy_cores_now(window_s: float = 0.5) -> float | None:
    """Cores other jobs keep busy now, over ``window_s`` seconds of this process
    sleeping (``None`` where the OS does not count busy time)."""
    start = CpuClock.now()
    time.sleep(window_s)
    return start.others_cores(CpuClock.now())


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
    others_cores: float | None = None
    """Cores other jobs kept busy on average during the run (measured,
    :class:`CpuClock`); ``None`` where the OS does not count busy time."""

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
    def others_busy(self) -> bool:
        """Whether other jobs shared the cores: measured where possible, else from the
        load averages."""
        if self.others_cores is not None:
            return busy_measured(self.others_cores, self.cores)
        return busy(self.others_load, self.cores)

    @property
    def under_load(self) -> bool:
        """Whether the run was made on a busy machine (module docstring: the rule)."""
        return self.others_busy or self.cpu_share < MIN_CPU_SHARE

    def describe(self) -> str:
        """One line: load before and after, the ranks' CPU share, and the verdict."""
        verdict = (
            "UNDER LOAD: other jobs shared the cores, timings are noisy"
            if self.under_load
            else "the machine was otherwise idle"
        )
        others = (
            ""
            if self.others_cores is None
            else f"; other jobs kept {self.others_cores:.2f} of them busy"
        )
        return (
            f"load average {self.before[0]:.2f} before, {self.after[0]:.2f} after on "
            f"{counted(self.cores, 'core')}{others}; the {counted(self.ranks, 'rank')} got "
            f"{self.cpu_share:.0%} "
            f"of their wall time as CPU time ({self.rank_cpu_s:.0f} of "
            f"{self.rank_wall_s:.0f} rank-seconds): {verdict}"
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
            "others_cores": self.others_cores,
            "under_load": self.under_load,
        }


def describe_start(
    before: tuple[float, float, float], num_cores: int, busy_now: float | None = None
) -> str:
    """The load before a run, for its first line (the CPU share is known only after):
    ``busy_now`` (:func:`busy_cores_now`) decides where measured, else the load average."""
    if busy_now is None:
        is_busy, now = busy(before[0], num_cores), ""
    else:
        is_busy, now = busy_measured(busy_now, num_cores), f", {busy_now:.2f} busy now"
    note = ": BUSY, other jobs share the cores and timings will be noisy" if is_busy else ""
    return f"load average {before[0]:.2f} on {counted(num_cores, 'core')}{now}{note}"
