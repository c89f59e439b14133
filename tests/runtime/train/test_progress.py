"""Progress of long work: lines in a file (never bar frames), a bar on a terminal, and a
stop signal acknowledged at once."""

from __future__ import annotations

import io
import re
import signal
import time

from datacentric.progress import Progress, elapsed_text, progress_line
from datacentric.train.preemption import StopSignals

LINE = re.compile(r"^progress: .+ \d+/\d+ \(\d+%\), \d+ (s|min \d\d s) elapsed$")


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


def test_a_terminal_gets_a_bar():
    out = io.StringIO()
    with Progress("profiling", 4, unit="round", stream=out, terminal=True) as bar:
        bar.update(4)
    assert "profiling" in out.getvalue() and "4/4" in out.getvalue()


def test_the_line_format():
    assert progress_line("bench", 1, 4, 83.2) == "progress: bench 1/4 (25%), 1 min 23 s elapsed"
    assert elapsed_text(9.9) == "9 s" and elapsed_text(7322) == "2 h 02 min"


def test_a_stop_signal_is_acknowledged_at_once(capfd):
    with StopSignals(lambda signum: "finishing step 7, then saving") as signals:
        signals._handle(signal.SIGTERM, None)
        assert signals.signum == signal.SIGTERM
    assert capfd.readouterr().err == "datacentric train: SIGTERM: finishing step 7, then saving\n"
    with StopSignals() as quiet:
        quiet._handle(signal.SIGTERM, None)
    assert capfd.readouterr().err == ""
