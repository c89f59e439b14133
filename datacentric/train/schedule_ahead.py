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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from datacentric.schedule import Schedule


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
