"""What runs in a spawned rank's process: :func:`_worker_entry`, from its start to its
result or failure sent to the launcher, and the watch that ends the rank once the
launcher is gone (:func:`_exit_with_launcher`), removing the rendezvous folder the
launcher can no longer remove.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import select
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from datacentric.parallel.groups import device_for_backend
from datacentric.parallel.rank_failure import _portable_error
from datacentric.parallel.start_stops import (
    _HELD_STOPS,
    _STARTING,
    StoppedAtStart,
    _ignore_stop_signals,
)

_INIT_BARRIER = "TORCH_DIST_INIT_BARRIER"
"""torch's switch for a barrier on the store after a process group is built."""

RENDEZVOUS_FOLDER = "DATACENTRIC_RENDEZVOUS_FOLDER"
"""The environment variable that names a spawned rank's rendezvous folder: its launch's
own (mode 0700), removed once the ranks end, where the ranks may keep small files of
their own (the heartbeat's records) instead of appending to the store's file."""


def _worker_entry(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    backend: str,
    init_method: str,
    timeout_s: float,
    threads: int | None,
    results: Any,
    launcher_pid: int | None = None,
    stop_at_start: bool = False,
) -> None:
    if stop_at_start:  # a stop relayed while this rank starts is kept, not its death
        for sig in _HELD_STOPS:
            signal.signal(sig, _STARTING.handle)
    else:  # a SIGTERM ends the rank (the forkserver's is ignored)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_STOPS)  # held since the start
    if threads:
        torch.set_num_threads(threads)
    folder = _rendezvous_folder(init_method)
    if folder is not None:
        os.environ[RENDEZVOUS_FOLDER] = folder
    if launcher_pid is not None:
        _exit_with_launcher(launcher_pid, leftover=folder)
    try:
        device = device_for_backend(backend, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _init_every_rank(backend, init_method, rank, world_size, timeout_s)
        stopped = _STARTING.agreed(device) if stop_at_start else None
        value = StoppedAtStart(stopped) if stopped is not None else fn(*args)
        # The rank's work has ended (a run's own handlers are gone): a stop request
        # repeated now (a scheduler signals every process of the job again, the launcher
        # passes on a Ctrl-C) must not end it before its result reaches the launcher.
        _ignore_stop_signals()
        # Serialise here: the parent must not depend on this process's shared memory.
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException as err:  # noqa: BLE001 - every failure goes to the parent, named
        _ignore_stop_signals()  # as above: the failure is reported
        text = str(err).strip()
        summary = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
        report = (summary + "\n" + traceback.format_exc(), _portable_error(err))
        results.put((rank, False, report))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _init_every_rank(
    backend: str, init_method: str, rank: int, world_size: int, timeout_s: float
) -> None:
    """Initialise ``torch.distributed`` and return once every rank has: torch's barrier
    on the store after the process group is built (``TORCH_DIST_INIT_BARRIER=1``, for
    this call alone; later groups are as torch makes them).

    Without it a rank whose work has no collective could end while a peer was still
    taking its gloo connection, and that peer's start failed ('Gloo connectFullMesh
    failed ... Connection closed by peer'); the file rendezvous, which its ranks poll,
    made that more likely than rank 0's TCP store did."""
    previous = os.environ.get(_INIT_BARRIER)
    os.environ[_INIT_BARRIER] = "1"
    try:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    finally:
        if previous is None:
            del os.environ[_INIT_BARRIER]
        else:
            os.environ[_INIT_BARRIER] = previous


def _rendezvous_folder(init_method: str) -> str | None:
    """The folder of a ``file://`` rendezvous (:func:`~datacentric.parallel.launch.spawn`
    makes one for each launch, its ranks' alone), else None."""
    if not init_method.startswith("file://"):
        return None
    return os.path.dirname(init_method.removeprefix("file://"))


def _exit_with_launcher(
    launcher_pid: int, period_s: float = 0.5, leftover: str | None = None
) -> None:
    """Stop this rank (status 143) when the process that launched it is gone (killed, even
    with SIGKILL): a daemon thread watches it. The folder ``leftover`` (the ranks'
    rendezvous, which the launcher removes once they end) is removed first.

    It waits on multiprocessing's parent sentinel, a pipe whose write end only the launcher
    holds (for a rank of the forkserver too: its parent is named as the launcher), so the
    pipe ends with the launcher's process, even while the launcher is a zombie its own
    parent has not waited on (``kill(pid, 0)`` still succeeds on a zombie). Without that
    sentinel (a rank not started by multiprocessing) it polls ``launcher_pid``."""
    import threading

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == launcher_pid:
        watch = functools.partial(_exit_at_end_of, parent.sentinel, leftover)
    else:
        watch = functools.partial(_exit_when_pid_gone, launcher_pid, period_s, leftover)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _exit_at_end_of(sentinel: int, leftover: str | None = None) -> None:
    """End this process once the pipe ``sentinel`` reads its end (every writer is gone)."""
    while True:
        select.select([sentinel], [], [])
        if not os.read(sentinel, 1):
            _exit_without_launcher(leftover)


def _exit_when_pid_gone(pid: int, period_s: float, leftover: str | None = None) -> None:
    """End this process once ``pid`` is no process (a zombie still is one)."""
    while True:
        time.sleep(period_s)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _exit_without_launcher(leftover)
        except PermissionError:
            pass


def _exit_without_launcher(leftover: str | None) -> None:
    """End this process (status 143) after removing the folder ``leftover``, if any: its
    launcher, gone, cannot remove it (every rank tries; the first one removes it)."""
    if leftover is not None:
        shutil.rmtree(leftover, ignore_errors=True)
    os._exit(143)
