"""The next epoch's schedule, built while the current epoch trains.

A schedule is a pure function of (shapes, plan, world, seed, epoch), so building
epoch ``e + 1``'s on a background thread while epoch ``e`` trains gives the very
schedule the run would have built at the epoch boundary, on every rank alike; the
first step of the next epoch then waits for nothing (``schedule_wait_s`` of the step
records, docs/runtime.md). The thread runs the same function a step would have
called; an error it meets is raised where the schedule is taken, as it would have
been raised there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from datacentric.schedule import Schedule


class ScheduleAhead:
    """Builds ``make(epoch)`` ahead, one epoch at a time (:meth:`start`, :meth:`take`)."""

    def __init__(self, make: Callable[[int], Schedule]) -> None:
        self._make = make
        self._epoch: int | None = None
        self._thread: threading.Thread | None = None
        self._result: Schedule | None = None
        self._error: BaseException | None = None

    def start(self, epoch: int) -> None:
        """Start building ``epoch``'s schedule (a no-op when it is already under way
        or built); any other epoch's pending build is forgotten."""
        if self._epoch == epoch:
            return
        self._epoch, self._result, self._error = epoch, None, None
        self._thread = threading.Thread(
            target=self._run, args=(epoch,), name=f"schedule-epoch-{epoch}", daemon=True
        )
        self._thread.start()

    def _run(self, epoch: int) -> None:
        try:
            schedule = self._make(epoch)
        except BaseException as err:  # raised again by take(), where the caller expects it
            if self._epoch == epoch:
                self._error = err
            return
        if self._epoch == epoch:
            self._result = schedule

    def take(self, epoch: int) -> tuple[Schedule, float] | None:
        """``epoch``'s schedule built ahead and the seconds spent waiting for it (0.0
        when it was ready), or None when it was not started; the build's error, if
        it failed. Taken once: the next call for the same epoch returns None."""
        if self._epoch != epoch or self._thread is None:
            return None
        waited = 0.0
        if self._thread.is_alive():
            started = time.perf_counter()
            self._thread.join()
            waited = time.perf_counter() - started
        result, error = self._result, self._error
        self._epoch, self._thread, self._result, self._error = None, None, None, None
        if error is not None:
            raise error
        assert result is not None
        return result, waited
