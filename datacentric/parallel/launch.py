"""Starting ranks: N local processes (:func:`spawn`) or under torchrun
(:func:`~datacentric.parallel.groups.init_from_env`).

:func:`launch_mode` is the one place that decides how a job runs: under torchrun
(its environment is present), as ``nproc`` spawned local ranks, or as a single
process. :func:`launch` runs a worker that way, and
:func:`~datacentric.parallel.groups.process_groups` gives a process its groups the
same way (it lives beside the groups; its older path here still works); the CLI,
``DataCentric``, the trainer and the policy comparison all go through them.

A worker is a plain function. Inside it ``torch.distributed`` is initialised,
so it builds :class:`~datacentric.parallel.groups.ProcessGroups` and runs; the
same worker therefore runs under :func:`spawn` (tests, ``datacentric
equivalence``, one-machine benchmarks) and under ``torchrun`` after
:func:`~datacentric.parallel.groups.init_from_env`.

:func:`spawn` returns every rank's return value, re-raises the first failure
in the parent with the rank named, and turns a hang into a ``TimeoutError``
(collectives time out too), so a deadlock fails a test instead of hanging it.

This module holds the entry points and the launcher's loop over its ranks (start each,
collect their results); the pieces they use live beside it, and every name they had
here is still given from here:

- :mod:`~datacentric.parallel.rank_entry`: what runs in a spawned rank's process;
- :mod:`~datacentric.parallel.rank_failure`: a rank's failure, carried to the launcher
  (:class:`RankFailure`);
- :mod:`~datacentric.parallel.start_stops`: the stops a rank gets while it starts
  (:data:`RELAYED_SIGINT`, :func:`stop_signal_at_start`);
- :mod:`~datacentric.parallel.rank_processes`: where the ranks' processes start from
  (the forkserver) and what a signal to the launcher does to them.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue as queue_module
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from datacentric.log import get_logger
from datacentric.parallel.groups import (
    DEFAULT_TIMEOUT_S,
    backend_for,
    default_device,
    destroy_at_exit,
    device_for_backend,
    init_from_env,
    process_groups,
    under_torchrun,
)
from datacentric.parallel.rank_entry import _worker_entry
from datacentric.parallel.rank_failure import PEER_REPORT_WAIT_S, RankFailure, _died, _failure
from datacentric.parallel.rank_processes import SIGINT_GRACE_S, _context, _StopRanks
from datacentric.parallel.start_stops import (
    RELAYED_SIGINT,
    StoppedAtStart,
    _HoldStops,
    stop_requested_at_start,
    stop_signal_at_start,
)

__all__ = [
    # defined here: the entry points and the launcher's loop over its ranks
    "JOB_TIMEOUT_S",
    "LaunchMode",
    "cpu_cores",
    "free_port",
    "launch",
    "launch_mode",
    "oversubscription_note",
    "spawn",
    "_collect",
    "_start_rank",
    # given from here, defined beside it
    "PEER_REPORT_WAIT_S",
    "RELAYED_SIGINT",
    "SIGINT_GRACE_S",
    "RankFailure",
    "StoppedAtStart",
    "stop_requested_at_start",
    "stop_signal_at_start",
    # the older path of parallel/groups' names
    "DEFAULT_TIMEOUT_S",
    "backend_for",
    "default_device",
    "destroy_at_exit",
    "device_for_backend",
    "init_from_env",
    "process_groups",
    "under_torchrun",
]

JOB_TIMEOUT_S = 7 * 24 * 3600.0
"""Whole-job limit of :func:`launch` (collectives keep their own, shorter timeout)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (another program may bind it
    before the caller does; :func:`spawn`'s ranks meet by a file instead)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads_per_rank: int | None = 1,
    start_method: str | None = None,
    collective_timeout_s: float | None = None,
    forward_signals: bool = False,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` new processes and return their results by rank.

    Each process initialises ``torch.distributed`` (``backend``, rendezvous by a file in
    a private temporary folder, removed once the ranks end: no port that another program
    could take; collective timeout ``timeout_s``) before calling ``fn``; ``fn`` must be
    importable (a module-level function) and its return value serialisable with
    ``torch.save``. If any rank raises, the others are
    stopped and :class:`RankFailure` (a ``RuntimeError``) names the rank, carries its
    traceback and the exception it raised. If the
    ranks have not all returned after ``timeout_s`` seconds, they are stopped and
    ``TimeoutError`` names the missing ranks. ``threads_per_rank`` caps each
    rank's intra-op threads (many ranks on few cores); ``None`` leaves torch's
    default. ``start_method`` defaults to ``forkserver`` where available (see
    :func:`_context`), else ``spawn``. ``collective_timeout_s`` sets the collective
    timeout apart from the whole run's (default: ``timeout_s``). ``forward_signals``:
    a SIGTERM/SIGINT to this process reaches the ranks (SIGINT as :data:`RELAYED_SIGINT`,
    which a training rank names SIGINT) and the ranks' results are still awaited (for
    ranks that stop cleanly on it); a second SIGINT kills them. A Ctrl-C or SIGTERM that
    reaches the ranks before any of them runs ``fn`` ends them all without running it:
    this process says so in one line and exits with ``SystemExit(128 + signal)`` (130,
    143); one that reaches them later, before ``fn`` installs its own stop handler, is
    kept for it (:func:`stop_signal_at_start`).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    context = _context(start_method, fn)
    timeout = collective_timeout_s or timeout_s
    with _file_rendezvous() as init_method:
        entry = (fn, args, backend, init_method, timeout, forward_signals)
        values = _run_ranks(
            context, world_size, entry, threads_per_rank, timeout_s, forward_signals
        )
    _end_if_stopped_at_start(values)
    return values


@contextlib.contextmanager
def _file_rendezvous() -> Iterator[str]:
    """The ``init_method`` the ranks of one :func:`spawn` meet by: ``file://`` a file in a
    new folder only this user may open (mode 0700), torch's ``FileStore``; the folder goes
    once the ranks have ended, however they ended (a failure, a timeout, a signal).

    No port is involved: a port picked free (:func:`free_port`) and bound later by rank 0
    could be taken in between by another program, which then failed the run at its start
    or met its ranks."""
    folder = tempfile.mkdtemp(prefix="datacentric-rendezvous-")
    try:
        if "?" in folder or "#" in folder:  # the URL would end there
            raise ValueError(
                f"the temporary folder {folder} holds '?' or '#', which a file:// "
                "rendezvous cannot name; set TMPDIR to a folder without them"
            )
        yield "file://" + os.path.join(folder, "rendezvous")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_ranks(
    context: Any,
    world_size: int,
    entry: tuple[Any, ...],
    threads_per_rank: int | None,
    timeout_s: float,
    forward_signals: bool,
) -> list[Any]:
    """Start the ranks (:func:`_start_rank`), collect their results and join them: the
    body of :func:`spawn`, which owns the rendezvous they meet by. Any failure kills the
    ranks still running before it is raised."""
    results = context.Queue()
    processes: list[Any] = []
    # The stop handlers are in place before the first rank starts: a signal that comes
    # while the launcher is still starting ranks (a busy machine) reaches those started.
    stopper = _StopRanks(processes, forward=forward_signals)
    try:
        with stopper:
            with _HoldStops():
                for rank in range(world_size):
                    processes.append(
                        _start_rank(context, rank, world_size, entry, threads_per_rank, results)
                    )
            if stopper.forwarded is not None:  # forwarded while ranks were starting
                # a rank takes a repeated SIGTERM or RELAYED_SIGINT as one
                stopper.relay_stop()
            try:
                values = _collect(processes, results, timeout_s)
            except (RuntimeError, TimeoutError) as err:
                if stopper.forwarded is None:
                    raise
                # after a forwarded stop: most often a rank that died of the signal it was
                # sent; said in one line either way, so the exit status is never unexplained
                name = signal.Signals(stopper.forwarded).name
                first = (str(err).splitlines() or [type(err).__name__])[0]
                print(f"datacentric: after {name}: {first}", file=sys.stderr, flush=True)
                stopper.stop(stopper.forwarded)
    except BaseException:
        for process in processes:
            process.kill()
            process.join(timeout=10)
        raise
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return values


def _end_if_stopped_at_start(values: list[Any]) -> None:
    """Say in one line that the ranks stopped before their work started, and end this
    process with ``128 + signal``, if they did."""
    stopped = next((v.signum for v in values if isinstance(v, StoppedAtStart)), None)
    if stopped is not None:
        name = signal.Signals(stopped).name
        print(
            f"datacentric: stopped by {name} while the ranks were starting; nothing saved "
            "yet; start again with the same command",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + stopped)


def _start_rank(
    context: Any,
    rank: int,
    world_size: int,
    entry: tuple[Any, ...],
    threads_per_rank: int | None,
    results: Any,
) -> Any:
    """Start rank ``rank``'s process on :func:`_worker_entry`; ``entry`` holds the
    function, its arguments, the backend, the rendezvous (a ``file://`` URL), the
    collective timeout and whether stops are forwarded, as every rank gets them."""
    fn, args, backend, init_method, collective_timeout_s, forward = entry
    process = context.Process(
        target=_worker_entry,
        args=(
            rank,
            world_size,
            fn,
            args,
            backend,
            init_method,
            collective_timeout_s,
            threads_per_rank,
        ),
        kwargs={
            "results": results,
            "launcher_pid": os.getpid(),
            "stop_at_start": forward,
        },
        daemon=True,
    )
    process.start()
    return process


def _collect(processes: list[Any], results: Any, timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    values: dict[int, Any] = {}
    silent_deaths: dict[int, int] = {}
    while len(values) < len(processes):
        try:
            rank, ok, payload = results.get(timeout=0.2)
        except queue_module.Empty:
            for rank, process in enumerate(processes):
                if rank in values or process.is_alive():
                    continue
                # Dead, and the queue stayed empty three times since: it died without reporting.
                silent_deaths[rank] = silent_deaths.get(rank, 0) + 1
                if silent_deaths[rank] > 2:
                    raise _died(rank, process) from None
            if time.monotonic() > deadline:
                missing = [r for r in range(len(processes)) if r not in values]
                raise TimeoutError(
                    f"ranks {missing} did not finish within {timeout_s:.0f} s "
                    "(a deadlock: ranks issuing different collectives?)"
                ) from None
            continue
        if not ok:
            raise _failure(rank, payload, processes, results, values)
        values[rank] = torch.load(
            io.BytesIO(payload),
            weights_only=False,  # trusted: this launch's own ranks' results, over a local pipe
        )
    return [values[r] for r in range(len(processes))]


@dataclass(frozen=True)
class LaunchMode:
    """How this job runs: the one launch decision (see :func:`launch_mode`)."""

    kind: Literal["torchrun", "spawn", "single"]
    world_size: int
    restarts: int = 0
    """How often torchrun restarted the worker group (``--max-restarts``)."""


def launch_mode(nproc: int | None = None) -> LaunchMode:
    """Decide how the job runs: under torchrun when its environment (``RANK``,
    ``WORLD_SIZE``) is present, as ``nproc`` spawned local ranks when ``nproc > 1``,
    else as one process. ``nproc`` (a command's ``--world``) other than torchrun's world
    is an error."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc is not None and nproc != world:
            raise ValueError(
                f"--world {nproc} under torchrun (WORLD_SIZE={world}): torchrun starts the "
                f"ranks; drop --world (or give --world {world})"
            )
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        return LaunchMode("torchrun", world, restarts)
    if nproc is not None and nproc > 1:
        return LaunchMode("spawn", nproc)
    return LaunchMode("single", 1)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def oversubscription_note(world: int, backend: str, cores: int) -> str | None:
    """A one-line note when ``world`` local gloo ranks outnumber the CPU ``cores``, else None."""
    if backend != "gloo" or world <= cores:
        return None
    return (
        f"datacentric: note: {world} local ranks on {cores} CPU core(s): the ranks share "
        "the cores, so each step takes longer than with a core per rank (the numbers stay "
        "the same)"
    )


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nproc: int | None = None,
    collective_timeout_s: float = DEFAULT_TIMEOUT_S,
    timeout_s: float = JOB_TIMEOUT_S,
    device: str | torch.device | None = None,
    forward_signals: bool = False,
) -> dict[int, Any]:
    """Run ``fn(*args)`` on every rank as :func:`launch_mode` decides; returns the
    results this process sees by rank: every rank's after a spawn, this rank's own
    under torchrun (``torch.distributed`` initialised first), rank 0's alone.
    Ranks use NCCL with one GPU each when there are enough GPUs (and ``device`` is not
    the CPU), else gloo on the CPU (:func:`backend_for`). ``forward_signals``: see
    :func:`spawn` (spawned ranks only; torchrun forwards signals itself)."""
    mode = launch_mode(nproc)
    if mode.kind == "spawn":
        backend = backend_for(mode.world_size, device)
        note = oversubscription_note(mode.world_size, backend, cpu_cores())
        if note:
            get_logger().warning(note)
        values = spawn(
            fn,
            mode.world_size,
            *args,
            backend=backend,
            timeout_s=timeout_s,
            collective_timeout_s=collective_timeout_s,
            forward_signals=forward_signals,
        )
        return dict(enumerate(values))
    if mode.kind == "torchrun":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        groups = init_from_env(backend_for(local, device), timeout_s=collective_timeout_s)
        return {groups.rank: fn(*args)}
    return {0: fn(*args)}
