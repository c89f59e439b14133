"""Progress of long work on stderr: a bar on a terminal, plain lines in a file.

:class:`Progress` counts ``done`` of ``total`` units of one piece of work (profiling
rounds, steps scheduled, stages of a command). On an interactive terminal it draws a
tqdm bar, refreshed every second even while one unit takes long; anywhere else (a log
file, a pipe, a cluster's job output) it writes no bar frames but, every ``every_s``
seconds (10), one line::

    progress: schedule dcp-opt steps 3/7 (43%), 20 s elapsed, about 27 s left

(the time left, for units of like size, extrapolated from those done so far by
:class:`TimeLeft`) and a last line when it ends, if it wrote any (work shorter than
``every_s`` stays silent). No torch is imported here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

#: Seconds between two progress lines when stderr is not a terminal.
EVERY_S = 10.0


def elapsed_text(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


#: Units ending in a "ch" said as "k", whose plural adds only an "s".
_CH_AS_K = ("epoch",)


def counted(count: int, unit: str, spec: str = "", *, plural: str | None = None) -> str:
    """``1 step``, ``3 steps``, ``1,024 tokens`` (``spec`` formats the number, e.g.
    ``","``): the one plural of a number said with its unit in what a user reads
    (``micro-batch`` gives ``micro-batches``, ``policy`` ``policies``, ``epoch``
    ``epochs``; ``plural`` where no rule makes it: ``clip or image``, ``clips and
    images``)."""
    return f"{count:{spec}} {unit if count == 1 else plural or _plural(unit)}"


def _plural(unit: str) -> str:
    """The plural of an English noun of our units (:func:`counted`'s rules)."""
    if unit.endswith(_CH_AS_K):
        return unit + "s"
    if unit.endswith("y") and unit[-2:-1] not in ("a", "e", "o", "u"):
        return unit[:-1] + "ies"
    return unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")


def progress_line(
    what: str, done: int, total: int, seconds: float, *, time_left: bool = False
) -> str:
    """``progress: WHAT DONE/TOTAL (PCT%), ELAPSED elapsed``; with ``time_left`` (units
    of like size, such as steps), ``, about LEFT left`` while some but not all units
    are done (:func:`time_left_s`)."""
    share = 100.0 * done / total if total else 100.0
    line = f"progress: {what} {done}/{total} ({share:.0f}%), {elapsed_text(seconds)} elapsed"
    left = time_left_s(done, total, seconds) if time_left else None
    return line if left is None else f"{line}, about {elapsed_text(left)} left"


def time_left_s(done: int, total: int, seconds: float) -> float | None:
    """Seconds left if the units left take as long as those done so far on average
    (``None`` before the first unit and after the last; :class:`TimeLeft` with one mark)."""
    left = TimeLeft(total, start=0.0)
    left.reached(done, seconds)
    return left.seconds(seconds)


class TimeLeft:
    """The time left of ``total`` units of like size (steps, runs), from when each one
    ended: the mean time of the units measured, the first left out once a second is done
    if it took over twice the others' (it paid the start: compilation, caches, a
    profile, a search), less the time the unit now
    running has taken. ``partial`` (the share of that unit done, when it is known) gives
    that unit's own pace, weighed by the share (before any unit has ended, it alone gives
    the pace)."""

    def __init__(self, total: int, *, start: float, done: int = 0) -> None:
        self.total = int(total)
        self.start = start
        """When the work started (the clock's reading)."""
        self.first_pays = False
        """Whether the first count is always left out once a second is done (a search's
        first count pays its start: the tables its candidates share)."""
        self.marks: list[tuple[int, float]] = [(done, start)]
        """(units done, when) at the start and at each unit's end."""

    def reached(self, done: int, at: float) -> None:
        """``done`` units are done at time ``at``."""
        if done > self.marks[-1][0]:
            self.marks.append((done, at))

    def _first(self, own: float | None = None) -> tuple[int, float]:
        """The mark the pace is measured from: the start, or the first unit's end once
        a second is done if the first took over twice the others' mean (it paid the
        start: compilation, caches, a search) or :attr:`first_pays`; one like the others
        counts. With one unit done, ``own`` (the pace of the one now running, once half
        of it is told done and it has taken some time) stands for the others'."""
        if len(self.marks) < 2 or (len(self.marks) == 2 and not own):
            return self.marks[0]
        (done0, start), (done1, end1), (done, last) = self.marks[0], self.marks[1], self.marks[-1]
        first_pace = (end1 - start) / (done1 - done0)
        others_pace = (last - end1) / (done - done1) if done > done1 else own
        return self.marks[1] if self.first_pays or first_pace > 2 * others_pace else self.marks[0]

    def seconds(
        self,
        now: float,
        partial: float = 0.0,
        running: float = 1.0,
        own_left: float | None = None,
        since: float | None = None,
    ) -> float | None:
        """Seconds left at ``now`` (None: nothing measured yet, or all done);
        ``running``: the units the piece of work now running counts for (a stage
        weighed by its cost; 1 for steps); ``own_left``: that piece's own estimate of
        its rest (from its steps), else its pace is the time it has taken over
        ``partial``, from ``since`` where that is later than the last unit's end (work
        before it began is not its own: a stage's set-up before its first step)."""
        done, last = self.marks[-1]
        if done >= self.total:
            return None
        running = min(max(running, 1e-9), self.total - done)
        began = last if since is None else max(last, since)
        own = (now - began) / (partial * running) if partial > 0 else None
        first = self._first(own if partial >= 0.5 else None)
        if done > first[0]:
            per_unit = (last - first[1]) / (done - first[0])
        elif own_left is not None and partial < 1:
            per_unit = own_left / ((1 - partial) * running)
        elif own is not None:
            per_unit = own
        else:
            return None
        later = (self.total - done - running) * per_unit
        if own_left is not None:  # its steps' own estimate (they vary less than stages do)
            return later + own_left
        if own is not None:  # its pace so far, trusted as far as it has come
            pace = partial * own + (1 - partial) * per_unit
            return max(0.0, later + (1 - partial) * running * pace)
        return later + max(0.0, running * per_unit - (now - last))  # its usual time, less its own


#: The most of a step its told share counts for until the step is out (a policy may lay
#: out more than it said).
STEP_SHARE_MAX = 0.95


class StepShare:
    """How far the step a policy now builds is, as the policy tells it: ``step_begun(work)``
    (about ``work`` micro-batches to lay out), ``laid_out(count)`` (that many more laid
    out) and ``solved(seconds)`` (a solve its work did not count; ``dcp-opt``:
    :func:`~datacentric.scheduling.search_steps.step_begun`). A step callback that is
    one reads :meth:`step_share` for a time left inside a long step. ``clock``: the
    seconds a solve is told in (CPU seconds of the process that builds the step)."""

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.work = 0.0
        """Micro-batches the step now built lays out, as told (0: not told), and its
        solves counted as the micro-batches laid out in as long (:meth:`solved`)."""
        self.worked = 0.0
        """Of those, laid out so far."""
        self.begun_at = 0.0
        """When the step now built began (the clock's reading)."""

    def step_begun(self, work: float) -> None:
        """The step now built has about ``work`` micro-batches to lay out."""
        self.work, self.worked, self.begun_at = float(work), 0.0, self.clock()

    def laid_out(self, count: float) -> None:
        """The step now built has laid out ``count`` more micro-batches."""
        self.worked += count

    def solved(self, seconds: float) -> None:
        """The step now built has spent ``seconds`` in a solve its told work did not
        count (an exact solver's run, which takes from a millisecond to seconds as the
        instance goes): counted as the micro-batches the step laid out in as long before
        it, done and added to its work, so that its share moves by the solve's cost.
        Before any micro-batch is laid out it adds nothing (the solve's time then paces
        the step's first layouts)."""
        before = self.clock() - seconds - self.begun_at
        if self.work and self.worked > 0 and before > 0:
            count = seconds * self.worked / before
            self.work += count
            self.worked += count

    def step_out(self) -> None:
        """The step is out: nothing is told of the next till it begins."""
        self.work = self.worked = 0.0

    def step_share(self) -> float | None:
        """The share of the step now built that is done (at most :data:`STEP_SHARE_MAX`),
        None where not told."""
        return min(self.worked / self.work, STEP_SHARE_MAX) if self.work else None


class Progress:
    """Progress of ``what`` over ``total`` units; use as a context manager and call
    :meth:`update` per unit done (``stage=`` names what runs now). ``enabled=False``
    shows nothing; ``terminal`` overrides whether ``stream`` is one; ``time_left``:
    the lines say the time left (units of like size: steps, not stages; :class:`TimeLeft`);
    ``partial()``: the share (0 to 1) of the unit now running, with what it is (``step
    12/40``), for units long enough to show their own progress; ``clock``: seconds (tests
    script it). Work in stages of unlike cost counts each stage as units in proportion
    to its cost (:meth:`begin` names a stage and its units, :meth:`update` counts them
    done; :meth:`inside` tells how far the stage is, when it reports its own steps)."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        unit: str = "step",
        enabled: bool = True,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        every_s: float = EVERY_S,
        time_left: bool = False,
        partial: Callable[[], tuple[float, str] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.time_left = time_left
        self.partial = partial
        self.clock = clock
        self.total = int(total)
        self.done = 0
        self.stage = ""
        self.running = 1.0
        """Units the piece of work now running counts for (:meth:`begin`)."""
        self._inside: tuple[float, str] | None = None
        self._steps: TimeLeft | None = None
        """The steps of the stage now running, when it reports them (:meth:`inside`)."""
        self._steps_of = ""
        """What those steps are (``step``, ``search``)."""
        self._step_share = 0.0
        """The share done of the step after those (:meth:`inside`)."""
        self._share_at = 0.0
        """When that share last moved (the step's pace is measured up to then)."""
        self._step_begun: float | None = None
        """When that step began, where told (its pace is measured from then)."""
        self._outlook: Callable[[float], tuple[str, float | None]] | None = None
        """What runs and the seconds left, as the work tells them (:meth:`follow`)."""
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.every_s = every_s
        self.lines = 0
        """Progress lines written so far (not on a terminal)."""
        tty = terminal if terminal is not None else _isatty(self.stream)
        self._bar: Any = None
        if enabled and tty:
            from tqdm import tqdm

            # disable=False: TQDM_DISABLE quiets other libraries' bars, not this one
            self._bar = tqdm(
                total=self.total,
                desc=what,
                unit=unit,
                file=self.stream,
                disable=False,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
            )
        self._started = clock()
        self.left = TimeLeft(self.total, start=self._started)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        if enabled:
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1, *, stage: str | None = None) -> None:
        """``n`` more units done; ``stage`` names the one that runs now."""
        with self._lock:
            self.done = min(self.total, self.done + n)
            self.left.reached(self.done, self.clock())
            if n:
                self.running, self._inside, self._steps = 1.0, None, None
            if stage is not None:
                self.stage = stage
            if self._bar is not None:
                self._bar_postfix()
                self._bar.update(n)

    def set_total(self, total: int) -> None:
        """Count ``total`` units from now on (work whose size shows once it starts,
        such as the steps of an epoch)."""
        with self._lock:
            self.total = self.left.total = int(total)
            self.done = min(self.done, self.total)
            if self._bar is not None:
                self._bar.total = self.total
                self._bar.refresh()

    def reached(self, done: int, total: int) -> None:
        """``done`` of ``total`` units done (a callback such as ``build_schedule``'s
        ``on_step``: the total may show only once the work starts)."""
        if total != self.total:
            self.set_total(total)
        if done > self.done:
            self.update(done - self.done)

    def set_stage(self, stage: str) -> None:
        """Name what runs now, without counting a unit."""
        self.update(0, stage=stage)

    def begin(self, stage: str, units: float) -> None:
        """``stage`` runs now and counts for ``units`` (its share of the work's cost):
        the time left waits for it at the pace of the stages done so far."""
        self.update(0, stage=stage)
        with self._lock:
            self.running, self._inside, self._steps = float(units), None, None

    def inside(
        self,
        done: int,
        total: int,
        what: str = "step",
        step_share: float = 0.0,
        step_begun: float | None = None,
    ) -> None:
        """The stage now running has done ``done`` of its ``total`` steps (a callback
        such as ``build_schedule``'s ``on_step``), and ``step_share`` of the one after
        (:class:`StepShare`): its share counts for the time left, and the line says
        ``step DONE/TOTAL``; the step's pace is measured up to when its share last
        moved (work it tells nothing of, such as a search made once for the epoch, sets
        no pace for the steps after while it runs), from ``step_begun`` (the clock's
        reading when that step began, where told) if later than the last step's end. A
        count in another unit (``what``) starts its pace afresh; one whose total moves (a
        search's estimate of its own work) keeps it."""
        with self._lock:
            share = (done + step_share) / total if total else 0.0
            self._inside = (share, f"{what} {done}/{total}")
            if self._steps is None or self._steps_of != what:
                self._steps = TimeLeft(total, start=self.left.marks[-1][1])
                self._steps.first_pays = what == "search"
                self._steps_of = what
            self._steps.total = int(total)
            self._steps.reached(done, self.clock())
            if step_share != self._step_share:
                self._share_at = self.clock()
            self._step_share, self._step_begun = step_share, step_begun

    def set_aside(self, seconds: float) -> None:
        """Work made once for the stage now running (a search its later steps reuse) has
        just taken ``seconds`` of the clock: its steps' pace leaves it out, as if it had
        not run (their marks, and the step now built's begin and last share, that much
        later), since it does not come again. The share moved before that work began
        (a count heard with it, sent late, is not paced by it)."""
        with self._lock:
            if self._steps is None:
                return
            self._steps.marks = [(done, at + seconds) for done, at in self._steps.marks]
            self._share_at = min(self._share_at, self.clock() - seconds) + seconds
            if self._step_begun is not None:
                self._step_begun += seconds

    def follow(self, outlook: Callable[[float], tuple[str, float | None]] | None) -> None:
        """From now on ``outlook(now)`` says what runs and the seconds left (work whose
        parts run at once, each with its own time left); None: the units say them."""
        with self._lock:
            self._outlook = outlook

    def outlook(self, now: float | None = None) -> tuple[str, float | None]:
        """What runs and the seconds left at ``now`` (the clock's reading by default), as
        the line says them."""
        return self._now(self.clock() if now is None else now)

    def line(self) -> str:
        """The progress line as it stands."""
        now = self.clock()
        stage, left = self._now(now)
        what = f"{self.what} ({stage})" if stage else self.what
        line = progress_line(what, self.done, self.total, now - self._started)
        return line if left is None else f"{line}, about {elapsed_text(left)} left"

    def _now(self, now: float) -> tuple[str, float | None]:
        """What runs now (the stage, and where it is when it says) and the seconds left
        (None: not asked for, or nothing to tell yet)."""
        if self._outlook is not None:
            stage, left = self._outlook(now)
            return ", ".join(s for s in (self.stage, stage) if s), left if self.time_left else None
        running = self.partial() if self.partial is not None else self._inside
        share, inside = running if running is not None else (0.0, "")
        stage = ", ".join(s for s in (self.stage, inside) if s)
        if not self.time_left:
            return stage, None
        share = min(max(share, 0.0), 1.0)
        own = None
        if self._steps is not None:
            # a stage's steps give its pace once a second one is done (the first pays
            # the stage's search), or the step now built as far as it told its share;
            # till then, its usual cost less the time it has taken
            told = self._step_share
            steps = self._steps
            at = self._share_at if told else now
            begun = self._step_begun if told else None
            own = steps.seconds(at, told, since=begun) if len(steps.marks) > 2 or told else None
            share = share if own is not None else 0.0
        return stage, self.left.seconds(now, share, self.running, own)

    def _bar_postfix(self) -> None:
        """The bar's words after its count: our time left, then the stage (tqdm's own
        estimate, from its recent rate, is not shown: units may be unlike). The time left
        comes first: tqdm cuts a line to the terminal's width, and the stages of work run
        at once (``simulate``'s eight) fill 80 columns before it."""
        stage, left = self._now(self.clock())
        words = [f"about {elapsed_text(left)} left"] if left is not None else []
        words += [stage] if stage else []
        self._bar.set_postfix_str(", ".join(words), refresh=False)

    def _tick(self) -> None:
        wait = 1.0 if self._bar is not None else self.every_s
        while not self._stop.wait(wait):
            with self._lock:
                if self._bar is not None:
                    self._bar_postfix()
                    self._bar.refresh()
                else:
                    self._write(self.line())

    def _write(self, text: str) -> None:
        self.lines += 1
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop: close the bar, or write the last line when lines were written."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self.lines:
                self._write(self.line())
                self.lines = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
