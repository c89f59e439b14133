"""Which rank stopped, and what it was doing: a heartbeat every rank publishes.

A collective that times out on one rank says only that a peer did not answer. With a
:class:`Heartbeat` every rank publishes, once per ``period_s`` from a daemon thread, a
beat counter and what it is doing (the trainer's phase: a micro-batch and its
collective, the gradient sync, a checkpoint save). After a timeout,
:meth:`Heartbeat.describe_peers` reads every rank's record twice, ``2.5 * period_s``
apart: a rank whose counter did not move is stopped (SIGSTOP, a frozen host, a
debugger), one whose counter moved is alive but elsewhere (a deadlock: its phase says
where).

Where the records are kept: the ranks that :func:`~datacentric.parallel.launch.spawn`
started keep one small file each in their launch's rendezvous folder, replaced whole at
every beat (the store they met by there is a ``FileStore``, which appends every
``set`` to its file: about 90 bytes a rank a second, for as long as the run lasted).
Other ranks publish through the store the process group was built on (rank 0's for a
``tcp://`` rendezvous, torchrun's agent's), which keeps a key's last value; if it does
not answer either, the message says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.rank_entry import RENDEZVOUS_FOLDER

PREFIX = "datacentric/heartbeat"
"""The key of rank R's record in the job's store is ``PREFIX/R``."""

FILE_PREFIX = "heartbeat-"
"""Rank R's record in a spawned launch's rendezvous folder is the file ``heartbeat-R``."""


def _job_store() -> Any | None:
    """The default process group's store, or ``None`` (one process, or none exposed)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        return None


def _spawned_folder(store: Any) -> str | None:
    """The rendezvous folder of the launch that started this rank (named by
    :data:`~datacentric.parallel.rank_entry.RENDEZVOUS_FOLDER`) when ``store`` is the
    ``FileStore`` in it, else None (another launcher's store: an inherited setting
    does not count)."""
    import torch.distributed as dist

    folder = os.environ.get(RENDEZVOUS_FOLDER)
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if not folder or not isinstance(store, dist.FileStore):
        return None
    return folder if os.path.dirname(store.path) == folder else None


class _StoreRecords:
    """The ranks' records as keys of the job's store (a key keeps its last value)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def write(self, rank: int, record: str) -> None:
        self.store.set(f"{PREFIX}/{rank}", record)

    def read(self, rank: int) -> str | None:
        key = f"{PREFIX}/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def wait_at_most(self, seconds: float) -> None:
        """Bound each read (a store whose host stopped raises instead of hanging)."""
        self.store.set_timeout(timedelta(seconds=seconds))


class _FolderRecords:
    """The ranks' records as one file each in ``folder``, each replaced whole (a new
    file renamed over it, so a reader sees the last record or the one before it, never
    a part): the folder holds a record a rank however long the run beats."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _path(self, rank: int) -> str:
        return os.path.join(self.folder, f"{FILE_PREFIX}{rank}")

    def write(self, rank: int, record: str) -> None:
        path = self._path(rank)
        with open(path + ".new", "w", encoding="utf-8") as new:
            new.write(record)
        os.replace(path + ".new", path)

    def read(self, rank: int) -> str | None:
        if not os.path.isdir(self.folder):  # the launcher is gone and its ranks with it
            raise FileNotFoundError(f"the rendezvous folder {self.folder} is gone")
        try:
            with open(self._path(rank), encoding="utf-8") as record:
                return record.read()
        except FileNotFoundError:  # this rank has not beaten yet
            return None

    def wait_at_most(self, seconds: float) -> None:
        """Reads of local files do not wait."""


def _records_of_the_job() -> _StoreRecords | _FolderRecords | None:
    """Where this rank's job keeps the records: its spawned launch's folder, else the
    job's store, else nowhere (None)."""
    store = _job_store()
    if store is None:
        return None
    folder = _spawned_folder(store)
    return _FolderRecords(folder) if folder is not None else _StoreRecords(store)


class Heartbeat:
    """Publishes this rank's beat and phase; names stopped peers after a timeout."""

    def __init__(
        self, groups: ProcessGroups, phase: Callable[[], str], period_s: float = 1.0
    ) -> None:
        self.rank = groups.rank
        self.world_size = groups.world_size
        self.phase = phase
        self.period_s = period_s
        distributed = groups.distributed and groups.world_size > 1
        self.records = _records_of_the_job() if distributed else None
        """Where the records are kept (:class:`_FolderRecords`, :class:`_StoreRecords`);
        None for one process."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._count = 0

    def __enter__(self) -> Heartbeat:
        if self.records is not None:
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
        checkpoint save, so a peer never reads the phase before it). False when the
        records can no longer be written (the store or the folder is gone)."""
        if self.records is None:
            return True
        with self._lock:
            self._count += 1
            try:
                self.records.write(self.rank, f"{self._count}|{self.phase()}")
            except Exception:  # noqa: BLE001 - a dead store ends the beat, not the rank
                return False
        return True

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    def _read_all(self) -> dict[int, tuple[str, str]]:
        found = {}
        for rank in range(self.world_size):
            record = self.records.read(rank) if rank != self.rank else None
            if record is not None:
                count, _, phase = record.partition("|")
                found[rank] = (count, phase)
        return found

    def describe_peers(self) -> str:
        """``rank 1 stopped answering during <phase>`` (and what live peers do), or an
        empty string for one process; takes ``2.5 * period_s``."""
        if self.records is None:
            return ""
        self._stop.set()
        try:
            self.records.wait_at_most(max(3.0, 3 * self.period_s))
            before = self._read_all()
            time.sleep(2.5 * self.period_s)
            after = self._read_all()
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
