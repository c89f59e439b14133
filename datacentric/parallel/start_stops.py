"""The stops a spawned rank gets while it starts: a Ctrl-C the launcher relays
(:data:`RELAYED_SIGINT`) or a SIGTERM (a scheduler's preemption).

They are held (blocked) from before a rank's process starts (:class:`_HoldStops`) until
its entry (:func:`~datacentric.parallel.rank_entry._worker_entry`) can take them; it then
records the first one (:class:`_StartStop`) until the run installs its own stop handler,
which takes the record over (:func:`stop_signal_at_start`). A stop that reached any rank
before its work began ends every rank without running it: each returns
:class:`StoppedAtStart`, and the launcher says so in one line.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

import torch
import torch.distributed as dist

#: What a first SIGINT (Ctrl-C) to the launcher reaches its ranks as: a stop that a rank
#: names SIGINT, which a copy never turns into Ctrl-C pressed again (a Ctrl-C in a terminal
#: reaches the ranks too, and a copy of SIGINT itself, relayed a second later by a busy
#: launcher, would stop them without a save).
RELAYED_SIGINT = signal.SIGUSR1
#: The stops a rank holds (blocks) from before it starts until it can take them
#: (:func:`~datacentric.parallel.rank_entry._worker_entry`): a relayed Ctrl-C and
#: a SIGTERM (a scheduler's preemption).
_HELD_STOPS = (signal.SIGTERM, RELAYED_SIGINT)


@dataclass(frozen=True)
class StoppedAtStart:
    """What a spawned rank returns when a stop reached the ranks before ``fn`` ran."""

    signum: int


class _StartStop:
    """A rank's record of the first stop relayed to it while it starts (a Ctrl-C as
    :data:`RELAYED_SIGINT`, or a SIGTERM): its imports, the process group and ``fn``'s own
    start-up, until ``fn`` installs its stop handler (which takes the record over:
    :func:`stop_signal_at_start`)."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.signum: int | None = None
        """The signal the stop is named by: SIGINT for the relayed Ctrl-C."""

    def handle(self, signum: int, frame: Any) -> None:
        if self.at is None:
            self.at = time.monotonic()
            self.signum = int(signal.SIGINT if signum == RELAYED_SIGINT else signum)

    def agreed(self, device: torch.device) -> int | None:
        """The stop any rank got before ``fn``, None if none did (collective, on every
        rank): the largest signal, as a run's ranks agree on theirs."""
        flag = torch.tensor([self.signum or 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None


_STARTING = _StartStop()


def stop_requested_at_start() -> float | None:
    """When (``time.monotonic()``) a stop relayed to this spawned rank (a Ctrl-C or a
    SIGTERM) arrived while it was starting, before its run installed its own stop handler;
    None if none did. Which stop it was: :func:`stop_signal_at_start`."""
    return _STARTING.at


def stop_signal_at_start() -> int | None:
    """The stop relayed to this spawned rank while it was starting, before its run
    installed its own stop handler, as the run names it (``signal.SIGINT`` for a Ctrl-C
    relayed as :data:`RELAYED_SIGINT`, ``signal.SIGTERM``); None if none was."""
    return _STARTING.signum


class _HoldStops:
    """While active, :data:`_HELD_STOPS` are held (blocked) in this thread, and in the
    processes it starts (the forkserver, spawned ranks): a stop relayed to a rank before
    it can take it stays pending until
    :func:`~datacentric.parallel.rank_entry._worker_entry` can (pending, it survives the
    forkserver's ignored SIGTERM)."""

    def __enter__(self) -> None:
        # multiprocessing's resource tracker, when it starts, unblocks SIGTERM in the
        # thread that starts it (it blocks it only while it starts): started first, here.
        resource_tracker.ensure_running()
        self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_STOPS)

    def __exit__(self, *exc: Any) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGTERM, RELAYED_SIGINT):
        signal.signal(sig, signal.SIG_IGN)
