"""The launcher's side of its ranks' processes: where they start from
(:func:`_context`: the forkserver, started by :func:`_start_forkserver` with SIGTERM
ignored) and what a signal to the launcher does to them (:class:`_StopRanks`: kill them,
or pass the first stop on and await their results).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from datacentric.parallel.start_stops import RELAYED_SIGINT, _HoldStops

#: Seconds ranks get to end on a second SIGINT relayed to them before they are killed.
SIGINT_GRACE_S = 3.0

#: The longest path of an AF_UNIX socket, in bytes (``sun_path`` less its NUL: 108 on
#: Linux, 104 on macOS and the BSDs).
SOCKET_PATH_BYTES = 107 if sys.platform.startswith("linux") else 103
#: What multiprocessing adds to the temporary folder for the forkserver's socket:
#: its own folder (``/pymp-XXXXXXXX``), then the socket (``/listener-XXXXXXXX``).
PYMP_BYTES, LISTENER_BYTES = len("/pymp-") + 8, len("/listener-") + 8
#: Where the socket goes when ``TMPDIR`` leaves it too little room (as Python 3.14 does).
SHORT_TEMP_FOLDERS = ("/tmp", "/var/tmp")


class _StopRanks:
    """While active, SIGTERM/SIGINT/SIGHUP to the launcher kill its ranks first, then
    end the launcher with the signal's usual status (main thread only).

    ``forward``: the first SIGTERM/SIGINT is passed on to the ranks instead (SIGINT as
    :data:`RELAYED_SIGINT`; they stop after a step they agree on, save and return, and a
    training rank 0 names the signal the launcher got); a SIGTERM after it is the same request
    again (a scheduler repeats it and escalates with SIGKILL) and is ignored, so it never
    cuts the save short; a SIGINT or SIGHUP after it, or a rank that dies after the first,
    kills them all as above."""

    def __init__(self, processes: list[Any], forward: bool = False) -> None:
        self.processes = processes
        self.forward = forward
        self.forwarded: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRanks:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.forward and self.forwarded is None and signum in (2, 15):
            self.forwarded = signum
            self.relay_stop()
            return
        if self.forward and signum == 15:
            return  # the same stop request again: the ranks are saving
        self.stop(signum)

    def relay_stop(self) -> None:
        """Pass the forwarded stop on to every rank still running."""
        self.relay(RELAYED_SIGINT if self.forwarded == signal.SIGINT else self.forwarded)

    def relay(self, signum: int) -> None:
        """Send ``signum`` to every rank still running."""
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    def stop(self, signum: int) -> None:
        """Kill the ranks and end the launcher with ``128 + signum`` (SIGINT: interrupt).
        A SIGINT after a forwarded stop (Ctrl-C again) reaches the ranks first, and they
        get a moment to end on it: a training rank 0 then says which checkpoint is kept
        and which steps are lost."""
        if signum == signal.SIGINT and self.forwarded is not None:
            self.relay(signal.SIGINT)
            deadline = time.monotonic() + SIGINT_GRACE_S
            for process in self.processes:
                process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(timeout=10)
        if signum == 2:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def __exit__(self, *exc: Any) -> None:

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _context(start_method: str | None, fn: Callable[..., Any]) -> Any:
    """The multiprocessing context ranks start from.

    ``forkserver`` imports torch (and ``fn``'s module) once in a clean server
    process that never touched CUDA or OpenMP, then forks every rank of every
    later :func:`~datacentric.parallel.launch.spawn` from it: each rank starts in well
    under a second instead of re-importing torch (several seconds per rank on a busy
    machine).
    """
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        # The runtime, the reference models and the datasets: what most workers use.
        preload = ["torch", "datacentric.parallel.runtime", "datacentric.models.presets"]
        preload.append("datacentric.data")
        if fn.__module__ != "__main__":
            preload.append(fn.__module__)
        # Only the first call before the server starts takes effect.
        context.set_forkserver_preload(preload)
        _start_forkserver()
    return context


def _start_forkserver() -> None:
    """Start the forkserver (if it is not running) with SIGTERM ignored, as it ignores
    SIGINT: a scheduler's SIGTERM reaches every process of the job, and a forkserver it
    killed reports every rank as dead (exit code 255) while the ranks still save their
    checkpoint, so the launcher would kill them mid-save. Its ranks start with SIGTERM
    held too (:class:`~datacentric.parallel.start_stops._HoldStops`), so one sent to a
    starting rank waits for :func:`~datacentric.parallel.rank_entry._worker_entry` (which
    records it, or restores the default where stops are not forwarded) instead of being
    lost; a rank's run installs its own handler."""
    import threading
    from multiprocessing import forkserver

    _room_for_the_socket()
    if threading.current_thread() is not threading.main_thread():
        with _HoldStops():
            forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with _HoldStops():  # its ranks start with them held
            forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _room_for_the_socket() -> None:
    """Let the forkserver's socket path fit AF_UNIX's limit: multiprocessing binds it
    below the temporary folder (``TMPDIR``), so a folder longer than about 75 bytes (a
    cluster job's scratch folder) failed every launch with ``OSError: AF_UNIX path too
    long``. Such a folder leaves this process's multiprocessing folder (the socket's, a
    few bytes) in the first of :data:`SHORT_TEMP_FOLDERS` that is writable; everything
    else still goes under ``TMPDIR``. Where no such folder is writable, or
    multiprocessing already made its folder, the error names ``TMPDIR``."""
    from multiprocessing import util

    def fits(folder: str) -> bool:
        return len(os.fsencode(folder)) + PYMP_BYTES + LISTENER_BYTES <= SOCKET_PATH_BYTES

    if fits(tempfile.gettempdir()):
        return
    short = next(
        (f for f in SHORT_TEMP_FOLDERS if fits(f) and os.access(f, os.W_OK | os.X_OK)), None
    )
    previous = tempfile.tempdir
    if short is not None:
        tempfile.tempdir = short
    try:
        made = util.get_temp_dir()  # made once per process, kept until it ends
    finally:
        tempfile.tempdir = previous
    if len(os.fsencode(made)) + LISTENER_BYTES > SOCKET_PATH_BYTES:
        raise OSError(
            f"the temporary folder {made} leaves too little room for the rank launcher's "
            f"socket (AF_UNIX paths hold {SOCKET_PATH_BYTES} bytes): set TMPDIR to a "
            "shorter folder"
        )
