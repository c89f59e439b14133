"""Which rank stopped, and what it was doing: a heartbeat through the job's store.

A collective that times out on one rank says only that a peer did not answer. With a
:class:`Heartbeat` every rank publishes, once per ``period_s`` from a daemon thread, a
beat counter and what it is doing (the trainer's phase: a micro-batch and its
collective, the gradient sync, a checkpoint save). After a timeout,
:meth:`Heartbeat.describe_peers` reads every rank's record twice, ``2.5 * period_s``
apart: a rank whose counter did not move is stopped (SIGSTOP, a frozen host, a
debugger), one whose counter moved is alive but elsewhere (a deadlock: its phase says
where). The store is the one the process group was built on (a file the launcher made
for the ranks it started, rank 0's for a ``tcp://`` rendezvous, or torchrun's agent's);
if it does not answer either, the message says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from datacentric.parallel.groups import ProcessGroups

PREFIX = "datacentric/heartbeat"


def _job_store() -> Any | None:
    """The default process group's store, or ``None`` (one process, or none exposed)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        return None


class Heartbeat:
    """Publishes this rank's beat and phase; names stopped peers after a timeout."""

    def __init__(
        self, groups: ProcessGroups, phase: Callable[[], str], period_s: float = 1.0
    ) -> None:
        self.rank = groups.rank
        self.world_size = groups.world_size
        self.phase = phase
        self.period_s = period_s
        self.store = _job_store() if groups.distributed and groups.world_size > 1 else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._count = 0

    def __enter__(self) -> Heartbeat:
        if self.store is not None:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.is_set():
            if not self.publish():
                return
            self._stop.wait(self.period_s)

    def publish(self) -> bool:
        """Publish the beat and the phase now (the beat thread does every period; the
        trainer also calls it when it enters a phase a stall must be named by, such as a
        checkpoint save, so the store never shows the phase before it). False when the
        store is gone."""
        if self.store is None:
            return True
        with self._lock:
            self._count += 1
            try:
                self.store.set(f"{PREFIX}/{self.rank}", f"{self._count}|{self.phase()}")
            except Exception:  # noqa: BLE001 - a dead store ends the beat, not the rank
                return False
        return True

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    def _records(self) -> dict[int, tuple[str, str]]:
        found = {}
        for rank in range(self.world_size):
            key = f"{PREFIX}/{rank}"
            if rank != self.rank and self.store.check([key]):
                count, _, phase = self.store.get(key).decode().partition("|")
                found[rank] = (count, phase)
        return found

    def describe_peers(self) -> str:
        """``rank 1 stopped answering during <phase>`` (and what live peers do), or an
        empty string without a store; takes ``2.5 * period_s``."""
        if self.store is None:
            return ""
        self._stop.set()
        try:
            self.store.set_timeout(timedelta(seconds=max(3.0, 3 * self.period_s)))
            before = self._records()
            time.sleep(2.5 * self.period_s)
            after = self._records()
        except Exception:  # noqa: BLE001 - the store's host is the one that stopped
            return "the job's store did not answer either (its host or the launcher stopped?)"
        stopped = [
            f"rank {r} stopped answering during {after[r][1]}"
            for r in sorted(after)
            if before.get(r, ("", ""))[0] == after[r][0]
        ]
        elsewhere = [
            f"rank {r} is alive in {after[r][1]}"
            for r in sorted(after)
            if before.get(r, ("", ""))[0] != after[r][0]
        ]
        return "; ".join(stopped + elsewhere)


def is_timeout(err: BaseException) -> bool:
    """Whether ``err`` reads as a collective that timed out."""
    text = str(err).lower()
    return "timed out" in text or "timeout" in text
