"""Benchmark: how long ``datacentric train``'s first step waits for its schedule.

Runs ``datacentric train`` on CPU (the demo ``llama`` preset, the standard library's
source as 256-token chunks, 2,048 tokens a step: about 5,900 steps in the first epoch,
dcp-opt) for a few steps, and reads each step's ``schedule_wait_s`` (seconds the step
waited for scheduling on rank 0), loss and time from the run's ``metrics.jsonl``, and
the epoch's whole-schedule build time (``plan_seconds``) from
``schedules/epoch-0.json``. The 1-minute load average before and after says how busy
the machine was. Prints one markdown table row per repeat.

    .venv/bin/python benchmarks/schedule_stream.py [--iterations N] [--repeats N]
        [--global-batch-tokens N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(args: argparse.Namespace, out: Path) -> dict:
    """One ``train`` run in ``out``: its step records and schedule's build time."""
    command = [
        sys.executable,
        "-m",
        "datacentric",
        "train",
        "--model",
        "llama",
        "--max-tokens",
        str(args.max_tokens),
        "--global-batch-tokens",
        str(args.global_batch_tokens),
        "--iterations",
        str(args.iterations),
        "--cost.cost_model",
        "analytic",
        "--out",
        str(out),
        "--overwrite",
        "--no-progress",
        "--no-plots",
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    schedule = json.loads((out / "schedules" / "epoch-0.json").read_text())
    return {
        "steps": len(schedule["iterations"]),
        "waits": [r["schedule_wait_s"] for r in records],
        "losses": [r["loss"] for r in records],
        "step_s": [r["iteration_time_s"] for r in records],
        "build_s": schedule["meta"]["plan_seconds"],
        "wall_s": wall,
        "load": (load, os.getloadavg()[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--global-batch-tokens", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    print(
        "| steps in epoch | step 1 schedule_wait_s | later steps' schedule_wait_s | "
        "step times s | losses | whole build s | run wall s | load before / after |"
    )
    print("|---:|---:|---|---|---|---:|---:|---|")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            row = run_once(args, Path(folder) / "run")
        later = ", ".join(f"{w:.1f}" for w in row["waits"][1:])
        times = ", ".join(f"{t:.2f}" for t in row["step_s"])
        losses = ", ".join(f"{x:.4f}" for x in row["losses"])
        load = "{:.1f} / {:.1f}".format(*row["load"])
        print(
            f"| {row['steps']:,} | **{row['waits'][0]:.2f}** | {later} | {times} | {losses} | "
            f"{row['build_s']:.1f} | {row['wall_s']:.1f} | {load} |"
        )


if __name__ == "__main__":
    main()
