"""Stopping a run on SIGTERM/SIGINT at a step boundary that every rank agrees on.

Clusters send SIGTERM before they kill a job. With ``[checkpoint] save_on_signal``
(on by default) each rank records the signal (:class:`StopSignals`) instead of dying;
after every step the ranks take the largest signal any of them got
(:meth:`StopSignals.agreed`, one small all-reduce), so all of them stop after the same
step, save an ordinary checkpoint and exit with ``128 + signal``, the status torchrun
and schedulers read as "terminated by that signal" (preempted).

A repeated SIGTERM never cuts the save short: schedulers and launchers repeat and
forward it (a cluster signals every process of the job, and the ``--world N`` launcher or
torchrun passes it on again), and a handler can run long after its signal arrived (Python
runs it between instructions, so a rank busy in one long operation on a loaded machine
sees both together), so no timing tells a second request from a forwarded copy. They
escalate with SIGKILL after their own grace period, which the save must fit in
(docs/reliability.md, "Preemption"). A second SIGINT (Ctrl-C pressed again) more than
:data:`SECOND_SIGNAL_AFTER_S` after the first signal ends the process at once
(``checkpoints/latest`` is switched atomically, so it still names a complete checkpoint),
saying which checkpoint that is and which steps are lost.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from datacentric.parallel.groups import ProcessGroups, agree_max
from datacentric.parallel.launch import RELAYED_SIGINT, stop_signal_at_start

SECOND_SIGNAL_AFTER_S = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, RELAYED_SIGINT)


class StopSignals:
    """While active (a context manager, main thread only), SIGTERM and SIGINT are
    recorded rather than ending the process; :attr:`signum` is the first one seen, and
    ``announce`` says at once what happens next. A Ctrl-C the ``--world N`` launcher
    passes on (:data:`~datacentric.parallel.launch.RELAYED_SIGINT`) counts as SIGINT, but
    never as Ctrl-C pressed again; a Ctrl-C or SIGTERM it passed on while this rank was
    starting (:func:`~datacentric.parallel.launch.stop_signal_at_start`) is the first
    signal, named as the launcher got it.
    It takes over from :class:`StoppedWhileStarting` (torchrun's ranks)."""

    def __init__(
        self,
        announce: Callable[[int], str] | None = None,
        lost: Callable[[], str] | None = None,
    ) -> None:
        self.announce = announce
        """``announce(signum)``: the line written to stderr at once on the first signal
        (say, ``finishing step 12, then saving``); None: nothing is written."""
        self.lost = lost
        """``lost()``: what a stop at a second Ctrl-C keeps and loses (say, ``kept
        checkpoints/step-8; steps 9-11 are lost``), added to its line."""
        self.signum: int | None = None
        self._at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            if StoppedWhileStarting.active is not None:  # the run takes over from it
                StoppedWhileStarting.active.hand_over()
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            at_start = stop_signal_at_start()  # relayed while this rank started
            if at_start is not None:
                self._handle(at_start, None)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        relayed = signum == RELAYED_SIGINT
        if relayed:
            signum = signal.SIGINT
        if self.signum is None:
            self.signum, self._at = signum, time.monotonic()
            if self.announce is not None:
                line = f"datacentric train: {signal_name(signum)}: {self.announce(signum)}\n"
                os.write(2, line.encode())  # unbuffered: the handler may interrupt a print
        elif relayed:
            return  # a copy of the Ctrl-C this rank already got from its terminal
        elif signum == signal.SIGINT and time.monotonic() - self._at > SECOND_SIGNAL_AFTER_S:
            if self.announce is not None:  # Ctrl-C again: a person who will not wait
                what = f"; {self.lost()}" if self.lost is not None else ""
                line = f"datacentric train: SIGINT again: stopped now, without a save{what}\n"
                os.write(2, line.encode())
            os._exit(128 + signum)

    def agreed(self, groups: ProcessGroups) -> int | None:
        """The signal every rank stops for (collective: call after each step on every
        rank), or ``None`` while no rank got one."""
        return agree_max(groups, self.signum or 0)[0] or None

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class StoppedWhileStarting:
    """A torchrun rank's start-up (a context manager, main thread only): the process
    group, the model and the data open until its run's :class:`StopSignals` takes over.
    A SIGTERM/SIGINT then (torchrun passes its own on to every rank) ends this rank at
    once, in one line and with ``128 + signal``, instead of a traceback; one repeated
    while it ends is ignored. Spawned ranks keep theirs for the run instead
    (:func:`~datacentric.parallel.launch.stop_signal_at_start`)."""

    active: StoppedWhileStarting | None = None
    """The start-up under way in this process, if any."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StoppedWhileStarting:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
            StoppedWhileStarting.active = self
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return  # torchrun's copy of the Ctrl-C this rank already got
        self.signum = signum
        line = (
            f"datacentric train: stopped by {signal_name(signum)} while rank {self.rank} was "
            "starting; nothing saved yet; start again with the same command\n"
        )
        os.write(2, line.encode())
        raise SystemExit(128 + signum)  # unwinds: the run folder's lock is released

    def hand_over(self) -> None:
        """Give the signals back to what handled them before (the run's own handler
        takes them next)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        StoppedWhileStarting.active = None

    def __exit__(self, *exc: Any) -> None:
        if self.signum is None:  # once stopping, a repeated signal stays ignored
            self.hand_over()


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
