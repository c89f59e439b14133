"""Progress of long work: lines in a file (never bar frames), a bar on a terminal, and a
stop signal acknowledged at once."""

from __future__ import annotations

import io
import random
import re
import signal
import time

from datacentric.progress import Progress, elapsed_text, progress_line, time_left_s
from datacentric.train.checkpoints.preemption import StopSignals

LINE = re.compile(
    r"^progress: .+ \d+/\d+ \(\d+%\), \d+ (s|min \d\d s) elapsed"
    r"(, about \d+ (s|min \d\d s) left)?$"
)


def test_a_file_gets_a_line_every_interval_and_a_last_one():
    out = io.StringIO()
    with Progress("schedule", 3, stream=out, terminal=False, every_s=0.05) as bar:
        bar.set_stage("planning")
        time.sleep(0.3)
        bar.update(3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and "\r" not in out.getvalue()
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].startswith("progress: schedule (planning) 0/3 (0%), ")
    assert lines[-1].startswith("progress: schedule (planning) 3/3 (100%), ")


def test_short_work_and_disabled_progress_stay_silent():
    out = io.StringIO()
    with Progress("quick", 2, stream=out, terminal=False) as bar:
        bar.update(2)
    with Progress("off", 2, stream=out, terminal=True, enabled=False) as bar:
        bar.update(2)
    assert out.getvalue() == ""


def test_the_total_may_come_once_the_work_starts():
    out = io.StringIO()
    with Progress(
        "schedule dcp-opt steps", 1, stream=out, terminal=False, every_s=0.05, time_left=True
    ) as bar:
        bar.set_total(7)
        bar.update(3)
        time.sleep(0.2)
        bar.update(4)
    lines = out.getvalue().splitlines()
    assert any(re.search(r" 3/7 \(43%\), .* left$", line) for line in lines), lines
    assert lines[-1].startswith("progress: schedule dcp-opt steps 7/7 (100%), ")
    assert lines[-1].endswith("elapsed")


def test_a_terminal_gets_a_bar():
    out = io.StringIO()
    with Progress("profiling", 4, unit="round", stream=out, terminal=True) as bar:
        bar.update(4)
    assert "profiling" in out.getvalue() and "4/4" in out.getvalue()


def test_an_80_column_terminal_keeps_the_time_left_of_stages_run_at_once():
    """tqdm cuts the bar to the terminal's width: ``simulate``'s eight stages at once
    (each with its count) fill 80 columns, so the time left comes before them (after
    them, the line ended at 'megatron' and never said it)."""
    stages = "; ".join(
        f"{policy}, search {n}/722862"
        for n, policy in enumerate(("static", "static-reference", "megatron-dyncp", "dcp-opt"))
    )
    out = io.StringIO()
    with Progress("simulate on 32 ranks", 9, stream=out, terminal=True, time_left=True) as bar:
        bar.follow(lambda now: (stages, 42.0))
        bar.update(2)
        bar._bar_postfix()
        bar._bar.ncols = 80
        drawn = str(bar._bar)
        bar.follow(None)
    assert len(drawn) <= 80 and "2/9" in drawn and "about 42 s left" in drawn, drawn


def test_the_line_format():
    assert progress_line("bench", 0, 4, 83.2) == "progress: bench 0/4 (0%), 1 min 23 s elapsed"
    assert progress_line("bench", 4, 4, 83.2) == "progress: bench 4/4 (100%), 1 min 23 s elapsed"
    assert progress_line("stages", 1, 2, 9.0) == "progress: stages 1/2 (50%), 9 s elapsed"
    assert (
        progress_line("schedule dcp-opt steps", 3, 7, 21.0, time_left=True)
        == "progress: schedule dcp-opt steps 3/7 (43%), 21 s elapsed, about 28 s left"
    )
    assert elapsed_text(9.9) == "9 s" and elapsed_text(7322) == "2 h 02 min"


def test_a_stop_signal_is_acknowledged_at_once(capfd):
    with StopSignals(lambda signum: "finishing step 7, then saving") as signals:
        signals._handle(signal.SIGTERM, None)
        assert signals.signum == signal.SIGTERM
    assert capfd.readouterr().err == "datacentric train: SIGTERM: finishing step 7, then saving\n"
    with StopSignals() as quiet:
        quiet._handle(signal.SIGTERM, None)
    assert capfd.readouterr().err == ""


class ScriptedClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_time_left_from_a_fifth_of_the_work_on_is_within_half_of_the_truth():
    """100 steps, the first paying 8 s of start-up, the others 1 s +-40%: from step 20 on,
    at each step's end and half-way through the next, the time left is within 50% of the
    time the rest really takes (the mean of all steps, the first included, is not)."""
    rng = random.Random(0)
    durations = [8.0] + [rng.uniform(0.6, 1.4) for _ in range(99)]
    clock = ScriptedClock()
    bar = Progress("train", 100, enabled=False, time_left=True, clock=clock)
    naive_misses = 0
    for step, duration in enumerate(durations):
        for share in (0.0, 0.5):
            left = sum(durations[step:]) - share * duration
            if step >= 20:
                said = bar.left.seconds(clock.now)
                assert abs(said - left) <= 0.5 * left, (step, share, said, left)
                naive = time_left_s(step, 100, clock.now - 1000.0)
                naive_misses += abs(naive - left) > 0.5 * left
            clock.now += duration / 2
        bar.update()
    assert naive_misses > 0  # the plain mean counts the start-up in every step left
    line = bar.line()
    assert line.startswith("progress: train 100/100 (100%)") and "left" not in line


def test_a_unit_that_shows_its_own_progress_gives_the_pace_from_its_start():
    """Eight runs of about a minute (a demo's): from the first run's 20% on, the line says
    which step it is at and a time left within 50% of the truth."""
    clock = ScriptedClock()
    inside = {"share": 0.0}
    bar = Progress(
        "4 policies x 2 runs", 8, unit="run", enabled=False, time_left=True, clock=clock,
        partial=lambda: (inside["share"], f"step {round(40 * inside['share'])}/40"),
    )  # fmt: skip
    runs = [66.0, 54.0, 60.0, 63.0, 57.0, 60.0, 61.0, 59.0]
    for run, seconds in enumerate(runs):
        for tenth in range(10):
            inside["share"] = tenth / 10
            if run or tenth >= 2:
                left = sum(runs[run:]) - seconds * tenth / 10
                said = bar.left.seconds(clock.now, inside["share"])
                assert abs(said - left) <= 0.5 * left, (run, tenth, said, left)
            clock.now += seconds / 10
        inside["share"] = 0.0
        bar.update()
        if run == 0:
            inside["share"] = 0.5
            assert re.match(
                r"progress: 4 policies x 2 runs \(step 20/40\) 1/8 \(12%\), 1 min \d\d s elapsed, "
                r"about \d+ min \d\d s left$",
                bar.line(),
            ), bar.line()


def test_a_comparison_run_reports_its_steps_while_it_trains(tmp_path):
    from toy_schedule import toy_schedule

    from datacentric.train.comparison.measured_comparison import RunSteps
    from datacentric.train.run_folder import save_schedule

    steps, schedule = RunSteps(), toy_schedule()
    assert steps() is None  # no run yet
    steps.folder = tmp_path / "dcp-opt"
    assert steps() is None  # the run has not saved its schedule yet
    save_schedule(steps.folder, schedule)
    total = len(schedule.iterations)
    assert steps() == (0.0, f"step 0/{total}")
    (steps.folder / "metrics.jsonl").write_text('{"iteration": 0}\n')
    assert steps() == (1 / total, f"step 1/{total}")
