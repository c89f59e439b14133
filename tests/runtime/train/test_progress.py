"""Progress of long work: lines in a file (never bar frames), a bar on a terminal, and a
stop signal acknowledged at once."""

from __future__ import annotations

import io
import re
import signal
import time

from datacentric.progress import Progress, elapsed_text, progress_line
from datacentric.train.preemption import StopSignals

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
