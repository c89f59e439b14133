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
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import pickle
import queue as queue_module
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import resource_tracker
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from datacentric.log import get_logger
from datacentric.parallel.groups import (  # noqa: F401 - process_groups, destroy_at_exit, default_device: older path
    DEFAULT_TIMEOUT_S,
    backend_for,
    default_device,
    destroy_at_exit,
    device_for_backend,
    init_from_env,
    process_groups,
    under_torchrun,
)

#: Seconds ranks get to end on a second SIGINT relayed to them before they are killed.
SIGINT_GRACE_S = 3.0
#: What a first SIGINT (Ctrl-C) to the launcher reaches its ranks as: a stop that a rank
#: names SIGINT, which a copy never turns into Ctrl-C pressed again (a Ctrl-C in a terminal
#: reaches the ranks too, and a copy of SIGINT itself, relayed a second later by a busy
#: launcher, would stop them without a save).
RELAYED_SIGINT = signal.SIGUSR1
#: The stops a rank holds (blocks) from before it starts until it can take them
#: (:func:`_worker_entry`): a relayed Ctrl-C and a SIGTERM (a scheduler's preemption).
_HELD_STOPS = (signal.SIGTERM, RELAYED_SIGINT)
JOB_TIMEOUT_S = 7 * 24 * 3600.0
"""Whole-job limit of :func:`launch` (collectives keep their own, shorter timeout)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    if launcher_pid is not None:
        _exit_with_launcher(launcher_pid)
    try:
        device = device_for_backend(backend, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
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


#: Seconds the launcher waits, after a rank's failure, for the other ranks' reports (ranks
#: that refuse the same input report together); it stops waiting once every rank reported
#: or died (a rank waiting in a collective fails as soon as the failed one is gone).
PEER_REPORT_WAIT_S = 3.0


class RankFailure(RuntimeError):
    """A spawned rank's failure, raised by :func:`spawn`: ``rank R failed: Type: message``,
    then the rank's traceback.

    The first line names the rank, the class the rank raised (its own name) and its
    message, whatever ``error`` holds. ``error``: the exception the rank raised, rebuilt
    in the launcher, so the caller tells a refusal of bad input from a crash as it would
    in one process (where one process would raise ``MyError``, ``failure.error`` is one
    here: ``except RankFailure`` then look at ``error``):

    - as itself where its class's module imports here by its name, as ``pickle``
      imports it: a class of the script's ``__main__`` (this process's own), of an
      installed package, or of a module on ``sys.path`` that only the rank imported;
    - else as an instance of its nearest built-in class with its message (a
      ``ValueError`` subclass stays a ``ValueError``): a class of a file the rank loaded
      by its path (which is never run here), or one that does not pickle or does not
      take its message back;
    - None where not even that pickles.

    ``ranks``: every rank whose failure said the same (``rank`` among them) of the
    ``world_size``; :attr:`where` names them when they are not all."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        report: str,
        error: BaseException | None = None,
        ranks: tuple[int, ...] = (),
    ) -> None:
        super().__init__(f"rank {rank} failed: {report}")
        self.rank = rank
        self.world_size = world_size
        self.error = error
        self.ranks = ranks or (rank,)

    @property
    def where(self) -> str:
        """``on rank 1 of 2`` (``on ranks 0 and 2 of 4``) where only some ranks failed
        so; empty where every rank did (the same failure as in one process)."""
        if len(self.ranks) == self.world_size:
            return ""
        if len(self.ranks) == 1:
            return f"on rank {self.ranks[0]} of {self.world_size}"
        *most, last = (str(r) for r in self.ranks)
        return f"on ranks {', '.join(most)} and {last} of {self.world_size}"


def _portable_error(err: BaseException) -> tuple[bytes, ...]:
    """``err`` pickled for the launcher: as itself, then (where its class is not
    built-in) as an instance of its nearest built-in class with its message (a refusal
    stays a ``ValueError``, a crash an ``AttributeError``). The launcher takes the first
    it can rebuild (:func:`_rebuilt`): a class of a module the launcher cannot import
    comes back as the built-in one. Each one is left out where it does not pickle and
    come back here (its class may not take its message)."""
    builtin = next(c for c in type(err).__mro__ if c.__module__ == "builtins")
    exact = _pickled(lambda: err)
    plain = None
    if exact is None or type(err) is not builtin:
        plain = _pickled(lambda: _as_builtin(err, builtin)) or _pickled(lambda: builtin(str(err)))
    return tuple(data for data in (exact, plain) if data is not None)


def _as_builtin(err: BaseException, builtin: type[BaseException]) -> BaseException:
    """``err`` as an instance of ``builtin`` that says what ``err`` says: of its
    arguments where they say it (an ``OSError`` keeps its ``errno``), else of its text
    (a class whose ``__str__`` words its message from its fields)."""
    same = builtin(*err.args)
    return same if str(same) == str(err) else builtin(str(err))


def _pickled(make: Callable[[], BaseException]) -> bytes | None:
    """The exception ``make`` returns, pickled, where it unpickles here; else None."""
    try:
        data = pickle.dumps(make())
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - any failure: the caller tries a plainer one
        return None
    return data


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
    it can take it stays pending until :func:`_worker_entry` can (pending, it survives the
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


def _exit_with_launcher(launcher_pid: int, period_s: float = 0.5) -> None:
    """Stop this rank (status 143) when the process that launched it is gone (killed, even
    with SIGKILL): a daemon thread watches it.

    It waits on multiprocessing's parent sentinel, a pipe whose write end only the launcher
    holds (for a rank of the forkserver too: its parent is named as the launcher), so the
    pipe ends with the launcher's process, even while the launcher is a zombie its own
    parent has not waited on (``kill(pid, 0)`` still succeeds on a zombie). Without that
    sentinel (a rank not started by multiprocessing) it polls ``launcher_pid``."""
    import threading

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == launcher_pid:
        watch = functools.partial(_exit_at_end_of, parent.sentinel)
    else:
        watch = functools.partial(_exit_when_pid_gone, launcher_pid, period_s)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _exit_at_end_of(sentinel: int) -> None:
    """End this process once the pipe ``sentinel`` reads its end (every writer is gone)."""
    while True:
        select.select([sentinel], [], [])
        if not os.read(sentinel, 1):
            os._exit(143)


def _exit_when_pid_gone(pid: int, period_s: float) -> None:
    """End this process once ``pid`` is no process (a zombie still is one)."""
    while True:
        time.sleep(period_s)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(143)
        except PermissionError:
            pass


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

    Each process initialises ``torch.distributed`` (``backend``, TCP rendezvous on
    a free port of 127.0.0.1, collective timeout ``timeout_s``) before calling
    ``fn``; ``fn`` must be importable (a module-level function) and its return
    value serialisable with ``torch.save``. If any rank raises, the others are
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
    results = context.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    processes: list[Any] = []
    # The stop handlers are in place before the first rank starts: a signal that comes
    # while the launcher is still starting ranks (a busy machine) reaches those started.
    stopper = _StopRanks(processes, forward=forward_signals)
    try:
        with stopper:
            timeout = collective_timeout_s or timeout_s
            entry = (fn, args, backend, init_method, timeout, forward_signals)
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
    _end_if_stopped_at_start(values)
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
    function, its arguments, the backend, the rendezvous address, the collective
    timeout and whether stops are forwarded, as every rank gets them."""
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


def _context(start_method: str | None, fn: Callable[..., Any]) -> Any:
    """The multiprocessing context ranks start from.

    ``forkserver`` imports torch (and ``fn``'s module) once in a clean server
    process that never touched CUDA or OpenMP, then forks every rank of every
    later :func:`spawn` from it: each rank starts in well under a second
    instead of re-importing torch (several seconds per rank on a busy machine).
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
    held too (:class:`_HoldStops`), so one sent to a starting rank waits for
    :func:`_worker_entry` (which records it, or restores the default where stops are not
    forwarded) instead of being lost; a rank's run installs its own handler."""
    import threading
    from multiprocessing import forkserver

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


def _failure(
    rank: int, report: tuple[str, tuple[bytes, ...]], processes: list[Any], results: Any, done: dict
) -> RuntimeError:
    """Rank ``rank``'s failure (``report``: its text and :func:`_portable_error`), with
    the ranks that fail the same way within :data:`PEER_REPORT_WAIT_S` (every rank
    reported or died before then: no longer); ``done``: the ranks that returned. Where
    a rank ended without a word by then (killed, out of memory), its end is the failure,
    not what its peers met in a collective with it (gloo's ``Read error``, a
    ``DistError``)."""
    text, error = report
    summary = text.partition("\n")[0]
    alike = [rank]
    reported = set(done) | {rank}
    deadline = time.monotonic() + PEER_REPORT_WAIT_S
    while True:
        try:
            other, ok, payload = results.get(timeout=0.05)
        except queue_module.Empty:  # (a rank's report is queued before the rank ends)
            alive = [p.is_alive() for r, p in enumerate(processes) if r not in reported]
            if not any(alive) or time.monotonic() > deadline:
                break
            continue
        reported.add(other)
        if not ok and payload[0].partition("\n")[0] == summary:
            alike.append(other)
    dead = [r for r, p in enumerate(processes) if r not in reported and not p.is_alive()]
    if dead:  # ended without a word: the cause (the others lost it in a collective)
        return _died(dead[0], processes[dead[0]])
    return RankFailure(rank, len(processes), text, _rebuilt(error), tuple(sorted(alike)))


def _died(rank: int, process: Any) -> RuntimeError:
    """A rank that ended without reporting a result or a failure."""
    return RuntimeError(
        f"rank {rank} exited with code {process.exitcode} without a result "
        "(killed, out of memory, or a crash in native code)"
    )


def _rebuilt(portable: tuple[bytes, ...]) -> BaseException | None:
    """A rank's exception from :func:`_portable_error` (a local pipe's: trusted): the
    first that unpickles here, None where none does. Unpickling imports the module of
    the exception's class by its name, as ``pickle`` does (a class of the script's
    ``__main__`` is this process's own: ``multiprocessing`` names the ranks' main
    module ``__mp_main__`` and this one's too); no file is run by its path."""
    for data in portable:
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - its module does not import here: the next one
            continue
    return None


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
    else as one process. ``nproc`` other than torchrun's world is an error."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc is not None and nproc != world:
            raise ValueError(
                f"--nproc {nproc} under torchrun (WORLD_SIZE={world}): torchrun starts the "
                "ranks; drop --nproc"
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
