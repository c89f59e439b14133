"""A comparison's policies built at once, each in its own process, with one time left.

Each policy's stage (its schedule and simulation) runs in a forked process
(:func:`run_at_once`) and tells the parent, over a pipe of its own, what a
:class:`~datacentric.sim.policy_comparison.StageSteps` hears in a sequential run (its
steps, its search's count, its step's share), each with the CPU seconds
its process has spent, plus a heartbeat of those every :data:`HEARTBEAT_S`. The parent
(:class:`Watch`) keeps each stage's own progress on the clock of its CPU seconds, so a
stage's time left is its own remaining CPU seconds, measured as in a sequential run and
not slowed by the stages beside it; the time left of them all is that work spread over
the CPU the stages get together (measured over the last :data:`WINDOW_S`), and never
less than the longest one's at one core: no guess about a stage not yet run, as every
stage runs from the start. No torch is imported here.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing import connection
from typing import Any

from datacentric.progress import Progress

#: Seconds between two reports of a stage's CPU seconds while it tells nothing else.
HEARTBEAT_S = 0.5

#: Seconds over which the CPU the stages get together is measured.
WINDOW_S = 5.0

#: Least seconds between two reports of laid-out micro-batches or of a search's count.
RELAY_EVERY_S = 0.2


def fork_context() -> Any:
    """The fork start method's context, None where the platform has none."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


class Relay:
    """A worker's ``on_step``: what a stage tells (``StageSteps``' calls) goes to the
    parent with the worker's CPU seconds; counts told often are sent at most every
    :data:`RELAY_EVERY_S`."""

    def __init__(self, line: Any, policy: str) -> None:
        self.line, self.policy = line, policy
        """``line.put(message)`` sends to the parent (:class:`_Line`)."""
        self._laid = 0.0
        self._search: tuple[float, float] | None = None
        self._sent = 0.0

    def _send(self, news: str, *args: float) -> None:
        self.line.put(("news", self.policy, time.process_time(), news, args))
        self._sent = time.monotonic()

    def _flush(self) -> None:
        if self._laid:
            self._send("laid_out", self._laid)
            self._laid = 0.0
        if self._search is not None:
            self._send("searched", *self._search)
            self._search = None

    def __call__(self, done: int, total: int) -> None:
        self._flush()
        self._send("__call__", done, total)

    def step_begun(self, work: float) -> None:
        self._flush()
        self._send("step_begun", work)

    def solved(self, seconds: float) -> None:
        self._flush()
        self._send("solved", seconds)

    def set_aside(self, seconds: float) -> None:
        self._flush()
        self._send("set_aside", seconds)

    def laid_out(self, count: float) -> None:
        self._laid += count
        if time.monotonic() - self._sent >= RELAY_EVERY_S:
            self._flush()

    def searched(self, done: float, total: float) -> None:
        self._search = (done, total)
        if time.monotonic() - self._sent >= RELAY_EVERY_S or done >= total:
            self._flush()


class _Stage:
    """One policy's stage as the parent follows it: its own progress, on the clock of
    its CPU seconds, and (parent's clock, CPU seconds) as reported."""

    def __init__(self, policy: str, cpu: float, at: float, steps: Callable[[Progress], Any]):
        self.cpu = cpu
        self.seen: deque[tuple[float, float]] = deque([(at, cpu)])
        self.progress = Progress(policy, 1, enabled=False, time_left=True, clock=self._cpu)
        self.progress.begin(policy, 1)
        self.steps = steps(self.progress)
        self.ended = False
        self.told: tuple[float, float] | None = None
        """Its last own estimate: (CPU seconds left, at its CPU seconds)."""
        self.count: tuple[float, float] | None = None
        """Its last count, of its search or its steps: (done, total); None till told."""
        self.count_cpu = 0.0
        """Its CPU seconds when it told that count."""

    def _cpu(self) -> float:
        return self.cpu

    def heard(self, at: float, cpu: float) -> None:
        self.cpu = cpu
        self.seen.append((at, cpu))
        while len(self.seen) > 2 and self.seen[1][0] <= at - WINDOW_S:
            self.seen.popleft()

    def counting(self) -> bool:
        """Whether it has told a count of its work that is not all done."""
        return self.count is not None and self.count[0] < self.count[1]

    def whole_pace(self) -> float:
        """CPU seconds left at the pace of its count from its start, what it spent before
        its first count included (an estimate no shorter than its own, which leaves out
        that start: a search's pricing tables); infinite till it has counted some work."""
        if self.count is None or self.count[0] <= 0:
            return float("inf")
        done, total = self.count
        return max(0.0, self.count_cpu * (total - done) / done - (self.cpu - self.count_cpu))

    def left(self) -> tuple[str, float | None]:
        """What it does and its CPU seconds left: its own estimate, else its last one
        (as last heard or read) less the CPU spent since (between two of its counts),
        else None."""
        what, left = self.progress.outlook()
        if left is not None:
            self.told = (left, self.cpu)
        elif self.told is not None:
            left = max(0.0, self.told[0] - (self.cpu - self.told[1]))
        return what, left

    def rate_since(self, since: float, now: float) -> float:
        """The CPU it got per second since ``since``: up to its last report while it
        runs (the CPU it spent since is not told yet), up to ``now`` once it ended."""
        until = now if self.ended else self.seen[-1][0]
        return self.cpu_since(since) / max(until - since, 1e-9)

    def cpu_since(self, since: float) -> float:
        """CPU seconds spent since ``since`` (parent's clock), as far as reported."""
        then = self.seen[0][1]
        for (t0, c0), (t1, c1) in zip(self.seen, list(self.seen)[1:]):
            if t0 <= since:  # between two reports: as if spent evenly
                then = c0 + (c1 - c0) * min(1.0, (since - t0) / max(t1 - t0, 1e-9))
        return self.cpu - then


class Watch:
    """The parent's view of stages run at once: :meth:`begun`, :meth:`heard` and
    :meth:`ended` take what the workers report; :meth:`outlook` says what runs and the
    time left (a :meth:`Progress.follow <datacentric.progress.Progress.follow>`)."""

    def __init__(self, clock: Callable[[], float], steps: Callable[[Progress], Any]) -> None:
        self.clock = clock
        self.steps = steps
        """Makes a stage's step callback from its progress (``StageSteps``)."""
        self.stages: dict[str, _Stage] = {}
        self.start = clock()
        self._lock = threading.Lock()  # a progress ticker reads while the workers tell

    def begun(self, policy: str, cpu: float) -> None:
        with self._lock:
            self.stages[policy] = _Stage(policy, cpu, self.clock(), self.steps)

    def heard(self, policy: str, cpu: float, news: str = "", args: Sequence[float] = ()) -> None:
        """``policy``'s process has spent ``cpu`` seconds and tells ``news(*args)``."""
        with self._lock:
            stage = self.stages[policy]
            stage.heard(self.clock(), cpu)
            if news:
                getattr(stage.steps, news)(*args)
            if news in ("__call__", "searched"):
                stage.count, stage.count_cpu = (args[0], args[1]), cpu
            stage.left()  # its estimate kept as heard, however often the line is read

    def ended(self, policy: str, cpu: float | None) -> None:
        """``policy``'s stage is over (``cpu``: its process's last CPU seconds, if told)."""
        with self._lock:
            stage = self.stages.get(policy)
            if stage is not None:
                stage.heard(self.clock(), stage.cpu if cpu is None else cpu)
                stage.ended = True

    def outlook(self, now: float) -> tuple[str, float | None]:
        """The running stages (each as its own line says it) and the seconds left: their
        remaining CPU seconds (each its own estimate) over the CPU they get together,
        at least the longest one's at one core (None until a stage can tell). A stage with
        no estimate yet counts as much again as it has spent, and one that counts its
        work (a count told, not all done) at least as long as the longest estimate: a
        search's first count pays its start (the pricing tables), so its pace waits for
        its second, which on ``sft-longtail`` at 64 GPUs comes after 2.8 s of CPU, while
        the short stages, which tell their steps only as they end, are done within 0.7 s;
        but no longer than its whole count's pace, start included (:meth:`_Stage.whole_pace`:
        the former bound's search of 25 steps, done in 0.15 s of CPU on
        ``opensora-balanced``, is not counted as dcp-opt's 5 s)."""
        with self._lock:
            running = [s for s in self.stages.values() if not s.ended]
            told = [(*s.left(), s.cpu, s.counting(), s.whole_pace()) for s in running]
            since = max(self.start, now - WINDOW_S)
            rate = sum(s.rate_since(since, now) for s in self.stages.values())
        text = "; ".join(what for what, *_ in told)
        known = [seconds for _, seconds, *_ in told if seconds is not None]
        if not known or rate <= 0:
            return text, None
        longest = max(known)
        left = [
            seconds if seconds is not None else min(max(cpu, longest), whole) if counting else cpu
            for _, seconds, cpu, counting, whole in told
        ]
        return text, max(max(left) / min(rate, 1.0), sum(left) / rate)


def run_at_once(
    policies: Sequence[str],
    build: Callable[[str, Any], Any],
    *,
    workers: int,
    watch: Watch,
    on_end: Callable[[str, Any, BaseException | None, str], bool],
) -> None:
    """``build(policy, on_step)`` of each policy in its own forked process, at most
    ``workers`` at once, started in order; ``watch`` hears their progress. Each end
    calls ``on_end(policy, run, error, error_text)`` in the parent (run None on error);
    when it returns False the others are stopped (their processes ended). Each process
    tells the parent over a pipe of its own: one killed (SIGKILL, out of memory) ends
    its pipe, which ends its stage at once with an error naming how it ended, and
    cannot leave a lock held that the others' messages wait on (a shared queue's)."""
    context = fork_context()
    sys.stdout.flush()  # what is buffered is written once, not again by each process
    sys.stderr.flush()
    pending, running = list(policies), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                policy = pending.pop(0)
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_work, args=(writer, policy, build), daemon=True)
                process.start()
                writer.close()  # the process's end then ends the pipe
                running[policy] = (process, reader)
            readers = {reader: policy for policy, (_, reader) in running.items()}
            for reader in connection.wait(list(readers), timeout=HEARTBEAT_S):
                try:
                    kind, policy, cpu, *rest = reader.recv()
                except (EOFError, OSError):  # it ended without telling its end
                    if not _end(readers[reader], running, watch, on_end, None, None):
                        return
                    continue
                if kind == "begun":
                    watch.begun(policy, cpu)
                elif kind == "news":
                    watch.heard(policy, cpu, *rest)
                elif not _end(policy, running, watch, on_end, cpu, tuple(rest)):
                    return
    finally:
        for process, reader in running.values():
            process.terminate()
            process.join()
            reader.close()


def _end(
    policy: str,
    running: dict[str, Any],
    watch: Watch,
    on_end: Callable[[str, Any, BaseException | None, str], bool],
    cpu: float | None,
    outcome: tuple | None,
) -> bool:
    """``policy``'s stage is over: its process reaped, ``watch`` told (``cpu``: its last
    CPU seconds, if told) and ``on_end(policy, *outcome)``, an error naming how its
    process ended where it told no ``outcome`` (killed, out of memory); False where
    that stops the others."""
    process, reader = running.pop(policy)
    process.join()
    reader.close()
    if outcome is None:
        text = f"{_ended(process.exitcode)} before its stage was done"
        outcome = (None, RuntimeError(f"{policy}: {text}"), f"RuntimeError: {text}")
    watch.ended(policy, cpu)
    return bool(on_end(policy, *outcome))


def _ended(code: int | None) -> str:
    """How a worker's process ended, from its exit code (negative: the signal)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"its process was killed by {name} (exit code {code})"
    return f"its process ended with exit code {code}"


class _Line:
    """A worker's end of its pipe to the parent: ``put(message)`` sends it whole, one
    sender at a time (the heartbeat's thread and the build's)."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def put(self, message: tuple) -> None:
        with self.lock:
            self.conn.send(message)


def _work(conn: Any, policy: str, build: Callable[[str, Any], Any]) -> None:
    """A worker: build ``policy``'s stage, reporting its CPU seconds as it goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us on Ctrl-C
    line = _Line(conn)
    line.put(("begun", policy, time.process_time()))
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(line, policy, stop), daemon=True)
    beat.start()
    run, error, text = None, None, ""
    try:
        run = build(policy, Relay(line, policy))
    except Exception as err:  # sent to the parent, which raises or records it
        text = failure_text(err)
        error = err if _picklable(err) else RuntimeError(text)
    stop.set()
    beat.join()
    line.put(("done", policy, time.process_time(), run, error, text))
    conn.close()


def failure_text(err: BaseException) -> str:
    """How a stage's failure is recorded: ``Type: message``, after the notes added to
    ``err`` on its way up, each as ``note: `` (which of the stage's work raised it,
    ``efficiency_old_bound``), the same whether stages run at once or in turn."""
    notes = "".join(f"{note}: " for note in getattr(err, "__notes__", ()))
    return f"{notes}{type(err).__name__}: {err}"


def _heartbeat(line: _Line, policy: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        line.put(("news", policy, time.process_time(), "", ()))


def _picklable(err: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return False
    return True
