"""Record ``simulate_traces.json`` again on this code: the parent's view of
``datacentric simulate --dataset P --world W --json`` (every default policy at once) for
each preset of :data:`RUNS`, each run in its own process, one after another:

    .venv/bin/python -m tests.pure.sim.record_simulate_traces [PRESET@WORLD ...]

Per run: its end (seconds from the process's start to the stages' end) and each report
as the :class:`~datacentric.sim.stages_at_once.Watch` heard it, [when, "begun" | "heard"
| "ended", policy, CPU seconds of its process, what it told, its arguments]. A run named
on the command line replaces that run only. Takes about as long as the runs (a minute
or two on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

RUNS = (
    "longctx-1m@64",
    "opensora-balanced@32",
    "opensora-long@32",
    "opensora-short@32",
    "sft-longtail@64",
    "stdlib-code@8",
)
TRACES = Path(__file__).parent / "simulate_traces.json"


def record(run: str) -> dict:
    """One run's trace, recorded in this process (started afresh for it)."""
    start = time.monotonic()
    from datacentric.cli.main import main
    from datacentric.sim import policy_comparison, stages_at_once

    log: list[list] = []
    watch, build = stages_at_once.Watch, policy_comparison.run_policies

    def at() -> float:
        return round(time.monotonic() - start, 3)

    def begun(self, policy, cpu, _told=watch.begun):
        log.append([at(), "begun", policy, round(cpu, 4)])
        _told(self, policy, cpu)

    def heard(self, policy, cpu, news="", args=(), _told=watch.heard):
        told = [a if isinstance(a, int) else round(float(a), 4) for a in args]
        log.append([at(), "heard", policy, round(cpu, 4), news, told])
        _told(self, policy, cpu, news, args)

    def ended(self, policy, cpu, _told=watch.ended):
        if cpu is not None:
            log.append([at(), "ended", policy, round(cpu, 4)])
        _told(self, policy, cpu)

    ends: list[float] = []

    def run_policies(*args, **kwargs):
        runs = build(*args, **kwargs)
        ends.append(at())
        return runs

    watch.begun, watch.heard, watch.ended = begun, heard, ended
    policy_comparison.run_policies = run_policies
    preset, world = run.split("@")
    main(["simulate", "--dataset", preset, "--world", world, "--json"])
    return {"end": ends[0], "log": log}


def write(traces: dict) -> None:
    """``traces`` as the file keeps them: one report a line."""
    parts = []
    for run in sorted(traces):
        rows = ",\n".join(json.dumps(row, separators=(",", ":")) for row in traces[run]["log"])
        parts.append(f'"{run}": {{"end": {traces[run]["end"]}, "log": [\n{rows}\n]}}')
    TRACES.write_text("{\n" + ",\n".join(parts) + "\n}\n")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:  # a child: one run, its trace on stdout's last line
        trace = record(argv[1])
        print("\n" + json.dumps(trace))
        return
    traces = json.loads(TRACES.read_text()) if TRACES.exists() else {}
    for run in argv or RUNS:
        child = [sys.executable, "-m", "tests.pure.sim.record_simulate_traces", "--one", run]
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        traces[run] = json.loads(out.strip().splitlines()[-1])
        print(run, traces[run]["end"], len(traces[run]["log"]), file=sys.stderr)
    write(traces)


if __name__ == "__main__":
    main(sys.argv[1:])
