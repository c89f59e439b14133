"""The next epoch's schedule, built while the current epoch trains.

A schedule is a pure function of (shapes, plan, world, seed, epoch), so building
epoch ``e + 1``'s on a background thread while epoch ``e`` trains gives the very
schedule the run would have built at the epoch boundary, on every rank alike; the
first step of the next epoch then waits for nothing (``schedule_wait_s`` of the step
records, docs/runtime.md). The thread runs the same function a step would have
called; an error it meets is raised where the schedule is taken, as it would have
been raised there.

Each build is its own :class:`_Build`: it is ready when its schedule (or error) is
stored, not when its thread has exited, so taking a finished build waits 0.0 seconds
exactly, and a build that was forgotten can never hand its schedule to another epoch.

The epoch a run starts in (or a segment re-planned for another world) is streamed
instead (:class:`StreamedBuild`): its steps are built in order in a process of their
own (:class:`~datacentric.scheduling.epoch.EpochStream`) and each is handed to the
loop as soon as it is built, so the first step waits for its own step, not for the
epoch's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling.epoch import EpochStream


class _Build:
    """``make(epoch)`` running on its own thread; :attr:`done` once it returned or raised."""

    def __init__(self, epoch: int, make: Callable[[int], Schedule]) -> None:
        self.epoch = epoch
        self.done = threading.Event()
        self.schedule: Schedule | None = None
        self.error: BaseException | None = None
        thread = threading.Thread(
            target=self._run, args=(make,), name=f"schedule-epoch-{epoch}", daemon=True
        )
        thread.start()

    def _run(self, make: Callable[[int], Schedule]) -> None:
        try:
            self.schedule = make(self.epoch)
        except BaseException as err:  # raised again by take(), where the caller expects it
            self.error = err
        finally:
            self.done.set()


class ScheduleAhead:
    """Builds ``make(epoch)`` ahead, one epoch at a time (:meth:`start`, :meth:`take`)."""

    def __init__(self, make: Callable[[int], Schedule]) -> None:
        self._make = make
        self._build: _Build | None = None

    def start(self, epoch: int) -> None:
        """Start building ``epoch``'s schedule (a no-op when it is already under way
        or built); any other epoch's pending build is forgotten."""
        if self._build is None or self._build.epoch != epoch:
            self._build = _Build(epoch, self._make)

    def take(self, epoch: int) -> tuple[Schedule, float] | None:
        """``epoch``'s schedule built ahead and the seconds spent waiting for it (0.0
        when it was ready), or None when it was not started; the build's error, if
        it failed. Taken once: the next call for the same epoch returns None."""
        build = self._build
        if build is None or build.epoch != epoch:
            return None
        self._build = None
        waited = 0.0
        if not build.done.is_set():  # only a build still running is waited for
            started = time.perf_counter()
            build.done.wait()
            waited = time.perf_counter() - started
        if build.error is not None:
            raise build.error
        assert build.schedule is not None
        return build.schedule, waited


class StreamedBuild:
    """``stream``'s steps built in order away from the training loop: :meth:`step`
    hands out step ``k`` once it is built, :meth:`schedule` the whole schedule once
    every step is (the schedule ``build_schedule`` returns for the same inputs). An
    :class:`~datacentric.scheduling.epoch.EpochStream` is built in a process of its own on
    Linux (:func:`~datacentric.scheduling.epoch.serve_stream`; a thread of this process
    shares its interpreter lock with the training loop: streamed on a thread, a
    5,918-step epoch slowed the demo's CPU steps from 0.45 s to 4-5 s while it was
    built). The process is a fresh interpreter given the stream's pickled spec, not a
    fork: a fork of this process (which has threads: prefetch, heartbeat, checkpoints)
    inherited every lock another thread held at that moment, held forever, and a build
    that took one never sent a step. Where the spec does not pickle or load there, and
    elsewhere than Linux, and for another iterable of steps with a ``schedule()``, the
    steps are built on a thread here. An error of the build is raised where a step or
    the schedule is taken."""

    def __init__(self, stream: EpochStream, name: str) -> None:
        self.num_steps = stream.num_steps
        """Steps of the schedule (known before they are built)."""
        self._built: list[Iteration] = []
        self._schedule: Schedule | None = None
        self._error: BaseException | None = None
        self._done = False
        self._cancelled = False
        self._process: subprocess.Popen | None = None
        self._cond = threading.Condition()
        target, args = self._run, (stream,)
        if isinstance(stream, EpochStream) and sys.platform == "linux":
            try:
                target, args = self._serve, (stream, *self._start())
            except OSError:  # no process to be had: built here, on a thread
                self._process = None
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _start(self) -> tuple[Connection, Connection]:
        """Start the build process (:data:`_ENTRY`: a fresh interpreter, not a fork, so no
        lock another thread of this process holds, and no state of a thread pool, is
        inherited); the ends of the pipes its inputs go through and its steps come back
        through."""
        inputs_r, inputs_w = os.pipe()
        steps_r, steps_w = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, str(steps_w), str(BUILD_NICENESS)],
                stdin=inputs_r,
                pass_fds=(steps_w,),
                start_new_session=True,  # a Ctrl-C saves, then ends it
            )
        except OSError:
            os.close(inputs_w)
            os.close(steps_r)
            raise
        finally:
            os.close(inputs_r)
            os.close(steps_w)
        return Connection(inputs_w, readable=False), Connection(steps_r, writable=False)

    def _serve(self, stream: EpochStream, inputs: Connection, steps: Connection) -> None:
        """Send the build process ``sys.path`` and ``stream``'s spec, then store what it
        sends (:meth:`_receive`); where it cannot take them (they do not pickle, or do not
        load there), build ``stream`` here (:meth:`_run`)."""
        started = False
        try:
            inputs.send(sys.path)
            inputs.send(stream.spec)
            started = steps.recv() == ("started", None)
        except Exception:  # not picklable, or the process ended: built here instead
            pass
        finally:
            inputs.close()
        if started:
            self._receive(steps)
            return
        steps.close()
        self._end_process()
        self._run(stream)

    def _receive(self, conn: Connection) -> None:
        """Store the steps, then the schedule or the error, the process sends."""
        schedule, error = None, None
        try:
            while True:
                kind, value = conn.recv()
                if kind == "step":
                    with self._cond:
                        self._built.append(value)
                        self._cond.notify_all()
                elif kind == "schedule":
                    schedule = value
                    break
                else:
                    error = value
                    break
        except (EOFError, OSError):
            error = RuntimeError("the schedule's build process ended before its schedule")
        except Exception as err:  # what it sent does not load here: never wait for it
            error = RuntimeError(f"the schedule's build process sent what cannot be read: {err}")
        finally:
            conn.close()
            self._end_process()
            self._finish(schedule, error)

    def _end_process(self) -> None:
        """Reap the build process (killed first when it has not ended: it has sent all it
        will send)."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()

    def _run(self, stream) -> None:
        schedule, error = None, None
        try:
            for it in stream:
                with self._cond:
                    self._built.append(it)
                    self._cond.notify_all()
                if self._cancelled:
                    raise RuntimeError("the schedule's build was cancelled")
            schedule = stream.schedule()
        except BaseException as err:  # raised again where a step or the schedule is taken
            error = err
        self._finish(schedule, error)

    def _finish(self, schedule: Schedule | None, error: BaseException | None) -> None:
        with self._cond:
            self._schedule, self._error, self._done = schedule, error, True
            self._cond.notify_all()

    def cancel(self) -> None:
        """Stop building (a segment no longer run)."""
        self._cancelled = True
        process = self._process
        if process is not None and not self._done and process.poll() is None:
            process.kill()

    def built(self) -> int:
        """Steps built so far."""
        with self._cond:
            return len(self._built)

    def built_steps(self, start: int) -> list[Iteration]:
        """The steps built so far from ``start`` on."""
        with self._cond:
            return self._built[start:]

    def step(self, k: int) -> tuple[Iteration, float]:
        """Step ``k`` and the seconds spent waiting for it (0.0 when it was built)."""
        return self._wait(lambda: self._built[k] if len(self._built) > k else None)

    def schedule(self) -> tuple[Schedule, float]:
        """The whole schedule and the seconds spent waiting for it (0.0 when built)."""
        return self._wait(lambda: self._schedule)

    def finished(self) -> Schedule | None:
        """The whole schedule when it is built, else ``None`` (never waits)."""
        with self._cond:
            if not self._done:
                return None
        return self.schedule()[0]

    def _wait(self, value: Callable[[], Any]) -> tuple[Any, float]:
        """``value()`` once it is not None (or the build has ended: its error), and the
        seconds waited for it."""
        waited = 0.0
        with self._cond:
            if value() is None and not self._done:
                started = time.perf_counter()
                self._cond.wait_for(lambda: value() is not None or self._done)
                waited = time.perf_counter() - started
            found = value()
            if found is None:
                raise self._error or RuntimeError("the schedule's build ended early")
            return found, waited


#: How much lower than the training loop's the build process's CPU priority is (Linux
#: niceness): it takes the cores the loop leaves idle.
BUILD_NICENESS = 10

#: The build process's program: SIGINT and SIGTERM ignored (its life is the parent's:
#: a Ctrl-C's checkpoint still gets its schedule), niceness ``argv[2]``, the parent's
#: ``sys.path`` read first, then :func:`~datacentric.scheduling.epoch.serve_stream`
#: with its steps sent through file descriptor ``argv[1]``.
_ENTRY = """
import os, signal, sys
from multiprocessing.connection import Connection
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
os.nice(int(sys.argv[2]))
inputs = Connection(0, writable=False)
sys.path[:] = inputs.recv()
from datacentric.scheduling.epoch import serve_stream
serve_stream(inputs, Connection(int(sys.argv[1]), readable=False))
"""
