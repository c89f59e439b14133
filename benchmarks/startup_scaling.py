"""Benchmark: how a run's start-up grows with the number of samples.

Times, at 1,000 to 1,000,000 samples of a workload preset, each step a training
run (and the Python API's ``DataCentric(...)``) takes before its first optimizer step
that depends on the data, calling the pure functions the run calls with the arguments
it gives them: the dataset's shapes, the held-out split (``split=0.05``), the
global-batch step (``run_global_batch``: sized, then checked on the run's epochs), a
given global batch below the covering bound (``check_global_batch`` then walks the
epochs), the buckets, the plan, the epoch's global batches and first step
(``Pipeline.stream``), and the steps of an epoch (``steps_per_epoch``, the warm-up
note's). Each stage runs 3 times on fresh inputs, the fastest reported; each size
runs in a child process of its own, so that its peak memory is
its own. A stage whose time grows more than 30x per 10x samples is flagged. A table per workload
(default: ``sft-longtail``, long-tailed text, and ``opensora-balanced``, video).
Writes ``benchmarks/startup_scaling.md``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/startup_scaling.py
        [--samples 1000,10000,...] [--workloads a,b] [--world N] [--largest-sp N]
        [--policy P] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A stage growing more than this many times per ten times the samples is flagged.
FLAG_PER_10X = 30.0

#: The stages, in the order a run takes them, and what each one calls.
STAGES = {
    "shapes": "the preset's sample shapes (`preset_shapes`, what `open_dataset` reads)",
    "split": "the held-out split `split=0.05` (`split_ids`)",
    "global batch": "`run_global_batch`: sized, then checked on 3 epochs",
    "given batch": "`check_global_batch` of a given 262,144-token batch, 3 epochs walked",
    "buckets": "`Pipeline.bucketing` (`make_buckets`)",
    "plan": "`Pipeline.plan` (the planner over the buckets)",
    "epoch batches": "`Pipeline.stream(0)`: the dataset view and the epoch's global batches",
    "first step": "the first step of that stream (what the first optimizer step waits for; "
    "a policy that does not build step by step builds the whole epoch here)",
    "steps/epoch": "`steps_per_epoch` (the warm-up note's count)",
}


#: Each stage runs this many times (on fresh inputs); the fastest is reported.
REPEATS = 3


def timed(
    row: dict[str, float],
    name: str,
    work: Callable[[Any], Any],
    prepare: Callable[[], Any] = lambda: None,
) -> Any:
    """``work(prepare())`` :data:`REPEATS` times, each on a fresh ``prepare()`` (not
    timed: so that no run finds what an earlier one cached); the fastest wall seconds
    stored in ``row[name]``; the last result returned."""
    best, out = float("inf"), None
    for _ in range(REPEATS):
        given = prepare()
        started = time.perf_counter()
        out = work(given)
        best = min(best, time.perf_counter() - started)
    row[name] = best
    return out


def given_batch_check(shapes: list, world: int, largest_sp: int) -> None:
    """``check_global_batch`` of a 262,144-token batch (below the covering bound of a
    long-tailed set on ``world`` ranks, so the epochs are walked), 3 epochs."""
    from datacentric.scheduling.global_batches import check_global_batch
    from datacentric.settings.scheduling import SchedulingConfig

    bound = max(2**18, max(s.tokens for s in shapes))
    options = SchedulingConfig(global_batch_tokens=bound)
    try:
        check_global_batch(
            options, shapes, world_size=world, largest_sp=largest_sp, seed=0, epochs=3
        )
    except ValueError:
        pass  # a step too short for the groups: the walk stopped there (rare)


def fresh_pipeline(
    shapes: list, cost: Any, world: int, options: Any, sp_sizes: list[int], made: str
) -> Any:
    """A new :class:`~datacentric.scheduling.pipeline.Pipeline` of the run's arguments,
    its buckets (``made`` is ``buckets``) or its buckets and plan (``plan``) made."""
    from datacentric.scheduling.pipeline import Pipeline
    from datacentric.sim.policy_comparison import simulation_budget

    budget = simulation_budget(cost)
    pipeline = Pipeline(
        shapes, cost, world_size=world, memory_cap_bytes=budget, options=options, sp_sizes=sp_sizes
    )
    if made in ("buckets", "plan"):
        _ = pipeline.bucketing
    if made == "plan":
        _ = pipeline.plan
    return pipeline


def stream_of(pipeline: Any) -> Any:
    """The epoch-0 stream of ``pipeline`` (its steps not built), unmeasured."""
    return pipeline.stream(0, measure=False)


def one_size(samples: int, workload: str, world: int, largest_sp: int, policy: str) -> dict:
    """Every stage at ``samples`` samples of ``workload`` on ``world`` ranks: seconds
    per stage, steps of the epoch and this process's peak memory (MiB)."""
    from datacentric.data.holdout import split_ids
    from datacentric.data.workloads import get_workload, preset_shapes
    from datacentric.scheduling.global_batches import run_global_batch, steps_per_epoch
    from datacentric.settings.scheduling import SchedulingConfig
    from datacentric.settings.sections import TrainingConfig
    from datacentric.sim.policy_comparison import simulation_cost_model

    wl = get_workload(workload, seed=0, num_samples=16)
    cost = simulation_cost_model(wl.model, wl.hardware, world)
    sp_sizes = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= largest_sp and world % s == 0]
    row: dict[str, float] = {}
    shapes = timed(row, "shapes", lambda _: preset_shapes(workload, 0, samples))
    timed(row, "split", lambda _: split_ids(len(shapes), 0.05, 0))
    batch = timed(
        row,
        "global batch",
        lambda _: run_global_batch(
            SchedulingConfig(policy=policy), TrainingConfig(epochs=3), 0, shapes, sp_sizes, world
        ),
    )
    timed(row, "given batch", lambda _: given_batch_check(shapes, world, largest_sp))
    options = batch.applied(SchedulingConfig(policy=policy))

    def fresh(made: str = "") -> Any:
        return fresh_pipeline(shapes, cost, world, options, sp_sizes, made)

    timed(row, "buckets", lambda p: p.bucketing, fresh)
    timed(row, "plan", lambda p: p.plan, lambda: fresh("buckets"))
    stream = timed(row, "epoch batches", stream_of, lambda: fresh("plan"))
    timed(row, "first step", lambda st: next(iter(st)), lambda: stream_of(fresh("plan")))
    timed(row, "steps/epoch", lambda _: steps_per_epoch(shapes, options, seed=0, world_size=world))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"samples": samples, "seconds": row, "steps": stream.num_steps, "peak_mib": peak}


def run_child(args: argparse.Namespace, workload: str, samples: int) -> dict:
    """:func:`one_size` in a child process (its own peak memory), with one thread."""
    argv = [sys.executable, __file__, "--one", str(samples), "--workloads", workload]
    argv += ["--world", str(args.world), "--largest-sp", str(args.largest_sp)]
    argv += ["--policy", args.policy]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth(rows: list[dict], stage: str) -> list[str]:
    """Per row after the first: how many times the stage's time grew, per ten times the
    samples (the ratio scaled by ``log10`` of the samples' ratio), ``-`` under a
    millisecond (timer noise)."""
    import math

    out = ["-"]
    for before, after in zip(rows, rows[1:]):
        t0, t1 = before["seconds"][stage], after["seconds"][stage]
        if t0 < 1e-3 or t1 < 1e-3:
            out.append("-")
            continue
        per_10x = (t1 / t0) ** (1 / math.log10(after["samples"] / before["samples"]))
        flag = " **flagged**" if per_10x > FLAG_PER_10X else ""
        out.append(f"{per_10x:.1f}x{flag}")
    return out


def markdown(tables: dict[str, list[dict]], args: argparse.Namespace) -> str:
    """The dated page of the results (``tables``: the rows of each workload)."""
    today = datetime.date.today().isoformat()
    lines = [
        f"# Start-up against the number of samples ({today})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs "
        f"(load average {os.getloadavg()[0]:.1f} at the end), Python "
        f"{platform.python_version()}, `OMP_NUM_THREADS=1`. Generated by "
        "`benchmarks/startup_scaling.py`. Wall seconds, the fastest of "
        f"{REPEATS} runs of each stage on fresh inputs, so approximate (the other jobs "
        "move them by tens of percent); each size in a process of its own.",
        "",
        f"Workload presets (seed 0) on {args.world} ranks, SP sizes up to "
        f"{args.largest_sp}, policy `{args.policy}`, the cost model of the `simulate` "
        "command. The stages a run takes before its first step that depend on the data:",
        "",
        *[f"- **{name}**: {what}" for name, what in STAGES.items()],
        "",
        f"`growth` is how many times a stage's time grew per 10x samples (linear: 10x); "
        f"above {FLAG_PER_10X:g}x it is flagged; `-`: a time under a millisecond (timer noise).",
        "",
    ]
    flagged = [
        f"{stage} ({workload})"
        for workload, rows in tables.items()
        for stage in STAGES
        if any("flagged" in cell for cell in growth(rows, stage))
    ]
    lines.append(
        f"Flagged: {', '.join(flagged)}."
        if flagged
        else "No stage grew faster than "
        f"{FLAG_PER_10X:g}x per 10x samples: every one is about linear in the samples (the "
        "first step waits for one global batch's step, not for the epoch's)."
    )
    for workload, rows in tables.items():
        lines += ["", f"## {workload}", "", *table(rows)]
    return "\n".join(lines) + "\n"


def table(rows: list[dict]) -> list[str]:
    """One workload's lines: seconds per stage and size, then growth per 10x."""
    lines = [
        "| samples | steps/epoch | peak MiB | " + " | ".join(STAGES) + " |",
        "|---:|---:|---:|" + "---:|" * len(STAGES),
    ]
    for r in rows:
        cells = [f"{r['seconds'][s]:.3f}" for s in STAGES]
        lines.append(
            f"| {r['samples']:,} | {r['steps']} | {r['peak_mib']:.0f} | " + " | ".join(cells) + " |"
        )
    lines += ["", "| growth per 10x | " + " | ".join(STAGES) + " |"]
    lines.append("|---|" + "---:|" * len(STAGES))
    columns = [growth(rows, s) for s in STAGES]
    for k, r in enumerate(rows[1:], start=1):
        step = f"{rows[k - 1]['samples']:,} -> {r['samples']:,}"
        lines.append(f"| {step} | " + " | ".join(c[k] for c in columns) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", default="1000,10000,100000,1000000")
    parser.add_argument("--workloads", default="sft-longtail,opensora-balanced")
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--largest-sp", type=int, default=8)
    parser.add_argument("--policy", default="dcp-opt")
    parser.add_argument("--out", default=str(Path(__file__).with_name("startup_scaling.md")))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's size
    args = parser.parse_args()
    if args.one is not None:
        found = one_size(args.one, args.workloads, args.world, args.largest_sp, args.policy)
        print(json.dumps(found))
        return
    tables: dict[str, list[dict]] = {}
    for workload in args.workloads.split(","):
        for samples in (int(s) for s in args.samples.split(",")):
            tables.setdefault(workload, []).append(run_child(args, workload, samples))
            print(workload, json.dumps(tables[workload][-1]), flush=True)
    Path(args.out).write_text(markdown(tables, args), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
