"""A rank whose work has returned reports its result even when a stop request comes
again meanwhile (a scheduler signals every process of the job more than once): the
repeated SIGTERM must not kill it between its run and its report."""

from __future__ import annotations

import os
import signal

from datacentric.parallel.launch import spawn


class _SignalledWhileReported:
    """A result whose serialisation (after the rank's function returned) brings a SIGTERM."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return (int, (15,))


def _returns_then_signalled() -> _SignalledWhileReported:
    return _SignalledWhileReported()


def test_a_sigterm_after_the_run_returned_does_not_lose_the_result() -> None:
    assert spawn(_returns_then_signalled, 2, timeout_s=120) == [15, 15]
