"""Benchmark: schedule 1,000,000 samples for 1,024 GPUs and 200,000 for 64, and the
``schedule`` command.

For each workload, the planner plans the buckets first (its CPU reported apart),
then ``build_schedule`` builds the epoch (timed: the number the targets are about, in
CPU seconds of the process), then the schedule is validated and measured (efficiency
against the ideal bound; timed separately). The extra rows (``--extra``, default
sft-longtail at 200,000 samples on 64 GPUs, where dcp-opt's portfolio runs) are
measured the same way. Then the whole ``datacentric schedule`` command a user runs
(``--dataset sft-longtail --world 64 --policy dcp-opt``, 100,000 samples: reading the
data, planning, dcp-opt with its portfolio, measuring), its CPU seconds from the
child process's own accounting. Writes ``benchmarks/schedule_scale.md``.

    .venv/bin/python benchmarks/schedule_scale.py [--samples N] [--gpus N]
        [--workloads a,b] [--policies a,b] [--extra WORKLOAD:SAMPLES@GPUS,...]
        [--command-gpus N] [--out FILE]
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
from pathlib import Path

from datacentric.data.workloads import get_workload
from datacentric.schedule import Schedule
from datacentric.scheduling import Pipeline, schedule_measures
from datacentric.scheduling.epoch import POLICIES
from datacentric.sim.policy_comparison import simulation_budget, simulation_cost_model
from datacentric.train.comparison.machine_load import CpuClock

#: Targets for the fast policy: CPU seconds of the process building one epoch's
#: schedule (``build_schedule``), by (samples, GPUs).
TARGET_CPU_S = {(1_000_000, 1024): 5.0, (200_000, 64): 8.0}
#: Target for the ``schedule`` command on sft-longtail at 64 GPUs: CPU seconds.
TARGET_COMMAND_CPU_S = 20.0


def run_command(gpus: int, policy: str = "dcp-opt") -> dict:
    """``datacentric schedule --dataset sft-longtail --world GPUS --policy P --json`` in a
    child process: its CPU seconds (user + system, the child's own), wall seconds, the
    load average around it and its report."""
    argv = [sys.executable, "-m", "datacentric.cli.main", "schedule", "--dataset"]
    argv += ["sft-longtail", "--world", str(gpus), "--policy", policy, "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()[0]
    clock = CpuClock.now()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    others = clock.others_cores(CpuClock.now())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads(done.stdout)
    return {
        "command": " ".join(["datacentric", *argv[3:]]),
        "cpu_s": cpu,
        "wall_s": wall,
        "load": (load_before, os.getloadavg()[0]),
        "others_cores": others,
        "report": report,
    }


def run_one(workload: str, policy: str, samples: int, gpus: int) -> dict:
    """Times and measures of one policy on one workload."""
    wl = get_workload(workload, seed=0, num_samples=samples)
    shapes = list(wl.shapes)
    cost = simulation_cost_model(wl.model, wl.hardware, gpus)
    pipeline = Pipeline(
        shapes, cost, world_size=gpus, memory_cap_bytes=simulation_budget(cost), policy=policy
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    _ = pipeline.plan
    plan_s = time.perf_counter() - started
    plan_cpu_s = time.process_time() - cpu_started
    load_before = os.getloadavg()[0]
    clock = CpuClock.now()
    started, cpu_started = time.perf_counter(), time.process_time()
    schedule = pipeline.schedule(measure=False)
    schedule_s = time.perf_counter() - started
    schedule_cpu_s = time.process_time() - cpu_started
    others = clock.others_cores(CpuClock.now())
    load_after = os.getloadavg()[0]
    started = time.perf_counter()
    schedule.validate()
    validate_s = time.perf_counter() - started
    started = time.perf_counter()
    ideal = pipeline.ideal_epoch_time()
    measures = schedule_measures(schedule, cost, ideal, shapes=shapes)
    measure_s = time.perf_counter() - started
    return {
        "workload": workload,
        "model": f"{wl.model} on {wl.hardware}",
        "policy": policy,
        "samples": len(shapes),
        "gpus": gpus,
        "iterations": len(schedule.iterations),
        "micro_batches": count_micro_batches(schedule),
        "plan_s": plan_s,
        "plan_cpu_s": plan_cpu_s,
        "schedule_s": schedule_s,
        "schedule_cpu_s": schedule_cpu_s,
        "load": (load_before, load_after),
        "others_cores": others,
        "validate_s": validate_s,
        "measure_s": measure_s,
        "efficiency": measures["efficiency"],
        "imbalance_mean": measures["imbalance_mean"],
    }


def count_micro_batches(schedule: Schedule) -> int:
    return sum(len(a.micro_batches) for it in schedule.iterations for a in it.assignments)


def markdown(rows: list[dict], samples: int, gpus: int) -> str:
    """The results as a dated markdown page."""
    today = datetime.date.today().isoformat()
    lines = [
        f"# Scheduling {samples:,} samples for {gpus:,} GPUs ({today})",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
        f"shared with other jobs (load average {os.getloadavg()[0]:.1f} at the end), Python "
        f"{platform.python_version()}. Generated by `benchmarks/schedule_scale.py`.",
        "",
        "`schedule s` is `build_schedule(..., measure=False)`: the work every rank does at "
        "the start of an epoch. Planning the buckets (`plan s`), validating the schedule "
        "and measuring it against the ideal bound are reported apart. Every micro-batch "
        "carries the cost model's own estimate (`SchedulingConfig.exact_estimates`, exact "
        "by default at any size since 2026-12-03; before, above 200,000 samples, "
        "multi-sample text micro-batches were interpolated on their bucket's cost curve). "
        "Default `SchedulingConfig`: equal global batches (one optimizer step per global batch "
        "of `world x max(2**18, longest sample)` tokens, one data order for every policy); "
        "cost model of `simulation_cost_model` (the `simulate` command's).",
        "",
        "Targets for the fast policy (`dcp-opt`, 2026-12-06), in CPU seconds of the process "
        "building the schedule (`cpu s`): "
        + ", ".join(f"{n:,} samples at {g:,} GPUs <= {t:g} s" for (n, g), t in TARGET_CPU_S.items())
        + ". CPU time is less sensitive to other jobs than the wall time (`schedule s`), not "
        "immune: they share caches and memory bandwidth; `plan cpu s` is the planner's, "
        "before (once per dataset, not per epoch); `load` is the 1-minute load average just "
        "before and just after the call (it remembers the last minute); `others` the cores "
        "other jobs kept busy during the call, measured from the cores' busy time less this "
        "process's (`train/comparison/machine_load.py`; `-` where the OS does not count it): "
        "near 0 on an otherwise idle machine.",
        "",
        "| workload | model | policy | samples | GPUs | iterations | micro-batches | plan s "
        "| plan cpu s | schedule s | cpu s | target | load | others | validate s | measure s "
        "| efficiency | imbalance |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        target = TARGET_CPU_S.get((r["samples"], r["gpus"]))
        met = (
            "-"
            if target is None
            else f"<= {target:g}: {'met' if r['schedule_cpu_s'] <= target else 'not met'}"
        )
        lines.append(
            f"| {r['workload']} | {r['model']} | {r['policy']} | {r['samples']:,} "
            f"| {r['gpus']:,} | {r['iterations']} "
            f"| {r['micro_batches']:,} | {r['plan_s']:.1f} | {r['plan_cpu_s']:.2f} "
            f"| {r['schedule_s']:.2f} | **{r['schedule_cpu_s']:.2f}** | {met} "
            f"| {r['load'][0]:.1f} / {r['load'][1]:.1f} "
            f"| {'-' if r['others_cores'] is None else format(r['others_cores'], '.2f')} "
            f"| {r['validate_s']:.1f} | {r['measure_s']:.1f} | {r['efficiency']:.3f} "
            f"| {r['imbalance_mean']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def command_markdown(row: dict) -> str:
    """The ``schedule`` command's section of the page."""
    r = row["report"]
    settings = r["settings"]
    others = "-" if row["others_cores"] is None else format(row["others_cores"], ".2f")
    return "\n".join(
        [
            "",
            f"## The `schedule` command at {r['world']} GPUs",
            "",
            f"`{row['command']}` ({r['samples_total']:,} samples, {r['cost_model']}): "
            f"the whole command, in a child process, as a user runs it. Target: "
            f"<= {TARGET_COMMAND_CPU_S:g} s of CPU. Measured on a 2-core CPU machine "
            "shared with other jobs (`load`: 1-minute load average before / after; "
            "`others`: cores other jobs kept busy), so the wall time says little; the CPU "
            "seconds are the child's own (inflated, not removed, by the sharing).",
            "",
            "| cpu s | wall s | load | others | iterations | efficiency | "
            "efficiency_old_bound | steps from peers | peers skipped | peers dropped |",
            "|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
            f"| **{row['cpu_s']:.1f}** | {row['wall_s']:.1f} | {row['load'][0]:.1f} / "
            f"{row['load'][1]:.1f} | {others} | {r['iterations']} | {r['efficiency']:.3f} | "
            f"{r['efficiency_old_bound']:.3f} | "
            f"{json.dumps(settings.get('steps_from_peers'))} | "
            f"{', '.join(settings.get('peers_skipped', [])) or '-'} | "
            f"{', '.join(settings.get('peers_dropped', [])) or '-'} |",
            "",
        ]
    )


#: Earlier runs of the command, kept on the page (each on a shared 2-core machine).
HISTORY = """
History of the command (CPU seconds of the whole process; the load matters): 176.6 s
(2026-12-03, load 0.5-1.9: every peer's search in dcp-opt's portfolio); 44.1 s (same
day, load about 12: `static`'s search skipped by its floor, `megatron-dyncp`'s made
cheaper); 41.9 s against 46.1 s for the code before, back to back at a load near 4
(memory checks without the time formula, one sum of a pass's shapes); 18.4 s (load 5.7):
`megatron-dyncp`'s search, two thirds of the rest and the source of none of the 7 steps,
no longer runs in the portfolio above 50,000 samples (`portfolio.PEER_SAMPLES`); then about
10-11 s: the command no longer imports torch (a sixth of it). The schedule is the same
in each: 0.972 of the proved bound, no step from a peer.

2026-12-06 (load average 6-13 on the 2 cores, so only the back-to-back pairs compare):
the planner, the proved bound and the per-step bound search rings inside a node too:
11.7 s of CPU at first (the former splits: 7.7 s, back to back); with a ring's memory
asked without the time formula and the ring formulas reading the pass's summed tokens
once, 8.9-9.2 s against 7.4-7.6 s with the former splits on the same code (two pairs,
alternated). dcp-opt's epoch 158.50 -> 158.09 s (in-node rings on some long documents),
0.9717 -> 0.9739 of the proved bound (each of its own bound; the one over every split is
0.04% lower), no step from a peer.
"""


#: Back-to-back pairs of the code before and after the 2026-12-06 build speed-ups (kept
#: on the page; measured apart from the table above, same machine).
BUILD_HISTORY = """
## Faster builds, same schedules (2026-12-06)

CPU seconds of one process, dcp-opt on sft-longtail (llama-7b on h200-sxm,
`simulation_cost_model`), the code before and after run back to back, alternated, on the
shared 2-core machine (`load`: its 1-minute load average after each run). `build` is
`Pipeline.schedule(measure=False)`, the number the targets are about; `plan` the planner
before it. Every policy's schedule (static, dcp-pac, megatron-dyncp, dcp-opt, dcp-inter,
dcp-intra, packed) on six sets (a log-normal set at 16 GPUs, sft-longtail, longctx-1m,
stdlib-code, opensora-balanced, opensora-long) and dcp-opt's on the two sets below is
byte-identical before and after (JSON, `plan_seconds` aside).

| set | code | plan cpu s | build cpu s | target | load |
|---|---|---:|---:|---|---:|
| 1,000,000 samples, 1,024 GPUs | before | 3.07 / 2.96 | 9.29 / 8.88 | 5 | 5.8 / 5.6 |
| 1,000,000 samples, 1,024 GPUs | after | 2.85 / 2.73 | **6.02 / 6.10** | not met | 5.7 / 6.1 |
| 200,000 samples, 64 GPUs | before | 0.72 / 0.70 | 12.40 / 12.29 | 8 | 5.2 / 4.5 |
| 200,000 samples, 64 GPUs | after | 0.53 / 0.55 | **4.69 / 4.82** | met | 5.1 / 4.2 |
| `schedule`, 100,000 samples, 64 GPUs (process) | before | - | 8.03 / 7.80 | 20 | 4.0 / 3.5 |
| `schedule`, 100,000 samples, 64 GPUs (process) | after | - | 3.78 / 4.02 | met | 3.8 / 3.5 |

What changed (each step checked byte-identical): text passes cached by their sums
(`CachedCostModel.prices_text_by_sums`; the analytic model's formulas read only a text
pass's count, summed tokens and summed squared tokens); HiGHS skipped where a small
search proves that nothing beats the heuristic's assignment (`exact.cannot_improve`;
on 200,000 samples it had run 14 times, 3.9 s, improving none); `balance.local_search`
remembering its answers by value (2,252 calls, 584 distinct, on 200,000 samples) and its
swaps writing into one work space instead of five step-sized arrays per try (the 26
searches at 1,024 GPUs: 3.4 -> 1.3 s); the proved bound's per-configuration work made once
per cost model; the analytic model's constant counts computed once (a distinct pass 46 ->
27 us). Left at 1,024 GPUs: the cost model's answers for about 21,000 distinct
micro-batches per epoch, the per-micro-batch recomputation knapsack of 1,063 long
samples (`choose_recompute`, 7,156 calls, 1.0 s measured before the analytic model's
speed-ups) and the layout search. The streamed build
(`train/schedule_ahead.py`, a forked process building the same `EpochStream`) runs the same
code, so it is faster by as much and its steps are unchanged.

Later the same day, the same way (the schedules of all seven policies on a log-normal set
at 16 GPUs, sft-longtail 20,000 at 64 and opensora-balanced 4,000 at 32, and dcp-opt's
on the two sets below, byte-identical before and after), at a lower load:

| set | code | plan cpu s | build cpu s | target | load |
|---|---|---:|---:|---|---:|
| 1,000,000 samples, 1,024 GPUs | before | 2.62 / 2.67 | 6.12 / 6.30 | 5 | 1.2 / 1.2 |
| 1,000,000 samples, 1,024 GPUs | after | 2.74 / 2.82 | **5.56 / 5.45** | not met | 1.3 / 1.2 |
| 200,000 samples, 64 GPUs | before | 0.56 / 0.60 | 5.14 / 5.36 | 8 | 1.2 / 1.1 |
| 200,000 samples, 64 GPUs | after | 0.60 / 0.59 | **5.03 / 5.23** | met | 1.1 / 1.2 |

(two more pairs at 1,000,000 samples, load 2.6-3.0: 6.07 / 6.41 -> 5.36 / 5.77 s.) What
changed: the epoch is built with Python's cyclic garbage collector paused
(`epoch.COLLECTOR_PAUSE`): the build keeps hundreds of thousands of new objects, so the
collector's full passes, which walk every sample shape of the dataset, came 3 times per
epoch at 1,000,000 samples (0.6 s of CPU, 0.8 s with the young generations); the
analytic model keeps `kv_head_repeat` per head counts and size (41,645 of 41,647 calls
were repeats) and reads a text pass's pairs from one tuple per model's kinds. Left at
1,024 GPUs (about 5.5 s of CPU, profiled): the local search after each layout's LPT
placement (about a quarter: the swaps' passes over a step's 22,000 micro-batches), the
cost model's answers and the keys of the 113,000 micro-batches' estimates (about a
fifth), the recomputation knapsack of the long samples (`choose_recompute`, about a
tenth), the layout search's splitting and the dataset view and global batches (about a
tenth each). The planner before the build (`plan cpu s`, once per dataset): `make_buckets`
places each distinct text length once, not each sample, the same buckets: 2.80 / 2.78 ->
0.67 / 0.64 s of CPU at 1,000,000 samples (back to back, load 2.6-3.8).

Later again the same day, the code before these steps and after them alternated (the
schedules of all seven policies on a log-normal set at 16 GPUs, sft-longtail 20,000 at 64,
opensora-balanced 4,000 at 32 and longctx-1m 2,000 at 64, and dcp-opt's on the two sets
below, byte-identical before and after each step):

| set | code | plan cpu s | build cpu s | target | load |
|---|---|---:|---:|---|---:|
| 1,000,000 samples, 1,024 GPUs | before | 0.51-0.54 | 4.95 / 4.78 / 5.04 | 5 | 3.0-3.6 |
| 1,000,000 samples, 1,024 GPUs | after | 0.49-0.50 | **4.10 / 4.22 / 4.47** | met | 3.0-3.2 |
| 200,000 samples, 64 GPUs | before | 0.16 / 0.18 | 4.41 / 4.63 | 8 | 2.9 / 2.6 |
| 200,000 samples, 64 GPUs | after | 0.17 / 0.17 | **4.32 / 4.44** | met | 2.7 / 2.6 |

What changed, one step at a time: `balance.local_search` makes fewer passes per try (a
move reads the size classes' least loads in one pass over the groups, a swap takes the
least of all items by one `argmin` and takes into its work space without numpy's
buffered bounds check; the 26 searches at 1,024 GPUs, replayed: 1.69-1.85 -> 1.31-1.52 s);
the estimates' keys are summed in one pass over the 114,000 micro-batches
(`DatasetView.batch_sums`: the estimates 1.10 / 1.01 -> 0.84 / 0.76 s); the analytic model
works out a pass recomputing nothing once for all its recomputation settings, with its
communication and total seconds (`AnalyticCostModel._plain`: passes worked out 48,030 ->
33,594, the build's breakdowns 0.84 / 0.78 -> 0.58 / 0.57 s over the two steps); the
dataset view and the data order sort bucket numbers by radix and count token lengths
(`dataset_view.stable_order`, `distinct_counts`: 0.48 / 0.48 -> 0.41 / 0.38 s); dcp-opt
asks whether a step's micro-batch straggles once per time matrix (35 -> 5 asks). Left at
1,024 GPUs (profiled): the local search (about a quarter), the estimates of the 114,000
micro-batches (about a seventh: the cost model's answers for about 10,600 distinct ones,
and their keys), the recomputation knapsack of the long samples (`choose_recompute`, 7,156
calls, about an eighth), then LPT, the dataset view and global batches, the items' packing
and the micro-batches' objects (each under a tenth). The first table then was the fourth of four
runs of the benchmark on this code in a row: 1,000,000 samples at 1,024 GPUs 4.46, 4.62,
4.93 and 4.45 s of CPU (load 1.9-2.0, 1.7-1.8, 1.5-1.6 and 3.5-3.9), 200,000 at 64 GPUs
4.12, 4.30, 4.61 and 4.45 s: the targets held in each, at 1,000,000 samples by as little
as 0.07 s (the third run), so on a busier machine it may not.

Later still the same day, the same way (the schedules of all seven policies on a
log-normal set at 16 GPUs, sft-longtail 20,000 at 64, opensora-balanced 4,000 at 32 and
longctx-1m 2,000 at 64, and dcp-opt's on sft-longtail 200,000 at 64 and 1,000,000 at
1,024, byte-identical before and after): LPT keeps its loads and owners in Python lists
and binds each size class's heap and size once, and `balance.local_search` calls array
methods, not numpy's dispatching functions (replayed at 1,024 GPUs: the 16 LPT
placements 0.31 -> 0.27-0.28 s, the 26 local searches 0.98-1.04 -> 0.85-0.93 s). The
build at 1,000,000 samples on 1,024 GPUs, the code before and after alternated: 4.30 /
4.34 / 4.96 -> 4.18 / 4.26 / 4.70 s of CPU at load 0.7-1.1; 4.70 / 4.41 / 4.55 -> 4.51 /
4.53 / 4.31 s at load 1.2; 4.91 / 4.66 / 4.20 / 4.36 -> 4.04 / 4.54 / 4.23 / 4.19 s at
load 3.5-5.8. That is 0.1-0.2 s, less than the spread of the same code's runs (4.2-5.0 s
at a load under 2), so the margin to the 5 s target is wider on average, not on every
run. The first table is the second of two benchmark runs in a row on this code (load
0.4-0.6, `others` 0.00); the first, with another job on one core (load 1.6, `others`
1.00), read 4.92 s at 1,000,000 samples and 4.20 s at 200,000. Tried and not kept, for
no gain measured: a step's estimates looked up in one call (0.71 / 0.67 -> 0.66 / 0.68 s)
and `MicroBatch` built with one write of its fields (114,000 objects, within the noise).
Left at 1,024 GPUs (profiled): the local search (about a fifth: a swap's five passes over
the step's 22,500 micro-batches per try), the recomputation choice of 7,156 long samples
(`choose_recompute`, about an eighth; most recompute nothing, so each costs the cost
model one memory and one time answer, and the time's breakdown works out the memory
again), the estimates (the cost model's answers for about 10,600 distinct micro-batches),
then LPT, the dataset view and global batches, the items' packing and the micro-batches'
objects.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--workloads", default="sft-longtail,opensora-balanced")
    parser.add_argument("--policies", default="dcp-opt")
    parser.add_argument(
        "--extra",
        default="sft-longtail:200000@64",
        help="more rows, WORKLOAD:SAMPLES@GPUS,... (empty: none)",
    )
    parser.add_argument("--command-gpus", type=int, default=64, help="0: skip the command")
    parser.add_argument("--out", default=str(Path(__file__).with_name("schedule_scale.md")))
    args = parser.parse_args()
    rows = []
    for workload in args.workloads.split(","):
        for policy in args.policies.split(","):
            if policy not in POLICIES:
                raise SystemExit(f"unknown policy {policy!r}")
            row = run_one(workload, policy, args.samples, args.gpus)
            print(row, flush=True)
            rows.append(row)
    for spec in filter(None, args.extra.split(",")):
        workload, size = spec.split(":")
        samples, gpus = size.split("@")
        for policy in args.policies.split(","):
            row = run_one(workload, policy, int(samples), int(gpus))
            print(row, flush=True)
            rows.append(row)
    page = markdown(rows, args.samples, args.gpus) + BUILD_HISTORY
    if args.command_gpus:
        command = run_command(args.command_gpus)
        print({k: v for k, v in command.items() if k != "report"}, flush=True)
        page += command_markdown(command) + HISTORY
    Path(args.out).write_text(page, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
