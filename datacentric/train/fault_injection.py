"""The ``[training] fault_inject`` setting at work: kill, hang, preempt or stop one rank
at one step, once per run folder (the reliability tests' faults).

``RANK:STEP`` kills rank RANK after its first micro-batch of step STEP (exit 17);
``:hang`` sleeps ten collective timeouts instead, ``:term`` sends SIGTERM to the whole
job as a cluster preempting it would, ``:stop`` SIGSTOPs the rank inside the checkpoint
save of step STEP, after its files are written. A marker file in the run folder records
that the fault fired, so a restarted job runs on.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from datacentric.settings.checks import parse_fault


@dataclass
class FaultInjection:
    """One planned fault of rank ``rank``'s run in folder ``out``."""

    rank: int
    """The rank that fails."""
    at: int
    """The step it fails at."""
    mode: str
    """``kill``, ``hang``, ``term`` or ``stop``."""
    out: Path
    """The run folder (the marker file's)."""
    this_rank: int
    """The rank this process is."""
    hang_s: float
    """How long a ``hang`` sleeps (ten collective timeouts)."""

    @classmethod
    def of(
        cls, spec: str | None, out: Path, this_rank: int, collective_timeout_s: float
    ) -> FaultInjection | None:
        """The fault ``spec`` (``[training] fault_inject``) names, ``None`` for none."""
        if not spec:
            return None
        rank, at, mode = parse_fault(spec)
        return cls(rank, at, mode, out, this_rank, 10 * collective_timeout_s)

    def _fires(self) -> bool:
        """Whether the fault fires now (once per run folder: the marker records it)."""
        marker = self.out / f".fault-injected-rank{self.rank}-at{self.at}"
        if marker.exists():
            return False
        marker.touch()
        return True

    def in_save(self, iterations_done: int) -> None:
        """``stop``: SIGSTOP this rank inside the checkpoint save of its step, after its
        files are written."""
        if self.mode != "stop" or self.this_rank != self.rank or iterations_done != self.at:
            return
        if self._fires():
            os.kill(os.getpid(), signal.SIGSTOP)

    def after_first_micro_batch(self, number: int) -> None:
        """Kill (or hang, or preempt) this rank after its first micro-batch of step
        ``number``."""
        if self.mode == "stop" or self.this_rank != self.rank or number != self.at:
            return
        if not self._fires():
            return
        if self.mode == "term":  # as a cluster preempting the job: every process of it
            os.killpg(os.getpgid(0), signal.SIGTERM)
            return
        if self.mode == "hang":
            time.sleep(self.hang_s)
        os._exit(17)
