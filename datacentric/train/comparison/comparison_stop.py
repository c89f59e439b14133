"""A measured comparison (``demo``, ``bench``) stopped by a signal says what it finished.

:func:`stopping_on_signals` wraps a comparison's runs: SIGTERM raises in the launcher as
SIGINT does (``SystemExit(128 + signum)``, as :mod:`datacentric.parallel.launch` ends a
launcher whose ranks it stopped), and a stop by SIGINT or SIGTERM, in a run or between
two, becomes :class:`ComparisonStopped` carrying the runs that finished, which the
command prints as one line.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from datacentric.progress import counted
from datacentric.train.checkpoints.preemption import signal_name

#: The signals a comparison stops for.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class ComparisonStopped(Exception):
    """A comparison stopped by ``signum`` after ``finished`` of its ``total`` runs."""

    signum: int
    finished: list[tuple[str, int]]
    """``(policy, repeat)`` of each run that finished (repeat 0-based), in run order."""
    total: int
    out: Path

    def __str__(self) -> str:
        done = ", ".join(f"{policy} run {repeat + 1}" for policy, repeat in self.finished)
        what = f"{done}; their folders are under {self.out}" if done else "none finished"
        return (
            f"stopped by {signal_name(self.signum)} after {len(self.finished)} of "
            f"{counted(self.total, 'run')} ({what}); no comparison without every run: run the "
            "command "
            "again"
        )


@contextmanager
def stopping_on_signals(finished: list[tuple[str, int]], total: int, out: Path) -> Iterator[None]:
    """Turn SIGINT and SIGTERM inside the block into :class:`ComparisonStopped` naming
    the runs ``finished`` holds by then (the caller appends each run as it finishes)."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _exit_for)
    try:
        yield
    except KeyboardInterrupt:
        raise ComparisonStopped(signal.SIGINT, list(finished), total, out) from None
    except SystemExit as exit_:
        signum = exit_.code - 128 if isinstance(exit_.code, int) else 0
        if signum not in STOP_SIGNALS:
            raise
        raise ComparisonStopped(signum, list(finished), total, out) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_for(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
