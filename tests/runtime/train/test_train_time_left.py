"""``train``'s step lines say a time left that holds: replayed on a scripted clock, a
recorded 100-step run's lines (``MetricsLogger``, the run's own code) are within half of
the time its steps really took from step 20 on. (The pace is the mean of the steps so
far: a run whose machine's load jumped for steps 33-46, 2-5 s each against 0.3-1.3,
read up to 1.6x high from step 39 on.)"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

from datacentric.train.reporting import metric_sinks
from datacentric.train.reporting.metric_sinks import MetricsLogger, setup_logging

#: ``datacentric train --config examples/configs/cpu.toml --iterations 100 --log-every 1``
#: on 2 shared cores at a steady load of 4-5 (its steps 0.2 to 1.2 s; a save every 3
#: steps): the seconds after the command started at which each step's line came.
STEP_LINES_AT = [
    11.63, 12.32, 13.20, 13.96, 14.33, 14.65, 15.41, 15.67, 15.90, 16.50,
    16.81, 17.13, 17.75, 18.09, 18.43, 19.16, 19.53, 19.81, 20.58, 20.84,
    21.14, 21.75, 22.15, 22.51, 23.13, 23.64, 23.96, 24.51, 24.89, 25.29,
    26.17, 26.42, 26.62, 27.55, 28.05, 28.54, 29.28, 29.61, 29.91, 30.76,
    31.24, 31.54, 32.35, 32.66, 32.95, 33.79, 34.35, 34.80, 36.03, 36.44,
    36.83, 37.67, 38.07, 38.45, 39.48, 39.80, 40.29, 41.11, 41.42, 41.74,
    42.53, 43.03, 43.48, 44.36, 44.81, 45.07, 45.67, 45.94, 46.29, 47.10,
    47.55, 47.96, 48.82, 49.20, 49.52, 50.41, 50.88, 51.42, 52.46, 53.18,
    53.62, 54.78, 55.23, 55.50, 56.26, 56.62, 56.98, 57.58, 57.92, 58.43,
    59.10, 59.38, 59.70, 60.76, 61.25, 61.55, 62.23, 62.52, 62.84, 63.52,
]  # fmt: skip
#: When the run's logger was made: step 1's line less its step time (2.57 s, the first
#: step's start-up).
STARTED_AT = 9.06

LEFT = re.compile(r"about (?:(\d+) min )?(\d+) s left$")


class Lines(logging.Handler):
    """The step lines the ``datacentric`` logger emits."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("step"):
            self.lines.append(record.getMessage())


def test_the_recorded_runs_step_lines_say_a_time_left_within_half_from_step_20_on(
    tmp_path, monkeypatch
):
    now = [STARTED_AT]
    monkeypatch.setattr(metric_sinks, "time", SimpleNamespace(monotonic=lambda: now[0]))
    setup_logging("info")
    lines = Lines()
    logging.getLogger("datacentric").addHandler(lines)
    try:
        sink = MetricsLogger(tmp_path, enabled=True, total=100, progress=False, log_every=1)
        for step, at in enumerate(STEP_LINES_AT):
            now[0] = at
            sink.log({"iteration": step, "loss": 3.0, "lr": 1e-3, "tokens_per_s": 1e3})
        sink.close()
    finally:
        logging.getLogger("datacentric").removeHandler(lines)
    assert len(lines.lines) == 100 and not LEFT.search(lines.lines[-1])
    bad = []
    for step, (line, at) in enumerate(zip(lines.lines[19:-1], STEP_LINES_AT[19:-1]), 20):
        said = LEFT.search(line)
        actual = STEP_LINES_AT[-1] - at
        seconds = 60 * int(said[1] or 0) + int(said[2]) if said else None
        if seconds is None or abs(seconds - actual) > 0.5 * actual + 1:  # whole seconds
            bad.append((step, seconds, round(actual, 1)))
    assert not bad, bad
