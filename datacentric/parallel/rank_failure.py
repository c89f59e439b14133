"""A spawned rank's failure, as the launcher raises it (:class:`RankFailure`).

The rank's side: :func:`_portable_error` pickles the exception the rank raised, as
itself and as its nearest built-in class, for the launcher. The launcher's side:
:func:`_failure` waits a moment for the other ranks' reports (ranks that refuse the same
input report together) and names every rank that failed alike, :func:`_rebuilt` rebuilds
the rank's exception from its pickles, and :func:`_died` words a rank that ended without a
word (killed, out of memory, a crash in native code).
"""

from __future__ import annotations

import pickle
import queue as queue_module
import time
from collections.abc import Callable
from typing import Any

#: Seconds the launcher waits, after a rank's failure, for the other ranks' reports (ranks
#: that refuse the same input report together); it stops waiting once every rank reported
#: or died (a rank waiting in a collective fails as soon as the failed one is gone).
PEER_REPORT_WAIT_S = 3.0


class RankFailure(RuntimeError):
    """A spawned rank's failure, raised by :func:`~datacentric.parallel.launch.spawn`:
    ``rank R failed: Type: message``, then the rank's traceback.

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
