"""A time limit on a block of a test (main thread): a read blocked on a special file or
a loop ends as :class:`Blocked` instead of holding the test run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Blocked(BaseException):
    """The block did not end within the limit (a ``BaseException``: the code under test
    must not swallow it in an ``except Exception``)."""


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raise :class:`Blocked` in the block once it has run ``seconds``."""

    def expired(*_: object) -> None:
        raise Blocked(f"still running after {seconds:g} s: blocked on a special file?")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
