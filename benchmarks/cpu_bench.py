"""Measured static vs DCP throughput on this machine's CPUs; writes cpu_bench.md.

    .venv/bin/python benchmarks/cpu_bench.py [--world 2] [--repeats 2] [--out-dir runs/cpu_bench]

Runs the comparison of ``datacentric demo`` (``datacentric.train.comparison.measured_comparison``):
tuned ``static``, ``static-reference``, ``dcp-pac`` and ``dcp-opt`` at one global batch,
one epoch of the same standard-library samples per policy, on ``--world`` gloo ranks, with
the tiny Llama, one dual-layer profile shared by all policies, and the simulator's
prediction for the very same schedules. Each policy runs ``--repeats`` times,
interleaved; the report gives medians, the spread between runs and every ratio as a
range, and how busy the machine was (load average, the CPU time the ranks got).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from pathlib import Path

import torch

from datacentric.cli.comparison_report import BENCH_DEFAULTS, bench_summary, describe_speedup
from datacentric.cli.demo import DEMO_POLICIES, DEMO_WARMUP
from datacentric.settings import load_config
from datacentric.train.comparison.measured_comparison import (
    DEFAULT_REPEATS,
    compare_policies,
    speedup_range,
)

POLICIES = DEMO_POLICIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--dataset-limit", type=int, default=BENCH_DEFAULTS["dataset_limit"])
    parser.add_argument("--out-dir", default="runs/cpu_bench")
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    settings = dict(BENCH_DEFAULTS, dataset_limit=args.dataset_limit)
    config = load_config(None, out=args.out_dir, **settings)
    start = time.perf_counter()
    comparison = compare_policies(
        config, POLICIES, args.world, args.out_dir, warmup=DEMO_WARMUP, repeats=args.repeats
    )
    wall = time.perf_counter() - start
    summary = bench_summary(comparison, POLICIES[0])
    results = comparison.policies
    base = results[POLICIES[0]]
    reference = results["static-reference"]
    load = comparison.load
    lines = [
        "# Static vs DCP, measured on CPU",
        "",
        f"Generated {dt.date.today().isoformat()} by `benchmarks/cpu_bench.py` on "
        f"{platform.machine()} with {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{args.world} gloo ranks, {args.repeats} runs of each policy interleaved (A B A B), "
        f"{wall / 60:.1f} min in all. Machine: {load.describe()}.",
        "",
        f"Model `{config.model.model}` on the first {config.data.dataset_limit} files of the "
        f"standard-library corpus (chunks of at most {config.data.max_tokens} bytes), memory cap "
        f"{config.cost.memory_gb} GiB per rank (the longest chunks need recomputation), model "
        f"state held as `shard = {config.parallelism.shard}`, one global batch of "
        f"{config.scheduling.tokens_per_iteration} tokens per optimizer step for "
        "every policy (the same samples in the same steps, so the loss curves agree: "
        f"`losses_equal` {summary['losses_equal']}). One epoch per policy and run, the same "
        "initial weights; the cost model is one dual-layer profile measured in the first run. "
        f"Times leave out each run's first {DEMO_WARMUP} step(s). `tokens/s` is the median "
        "over the runs and `runs` every run's; `noise` is the largest relative difference "
        "between two runs of the policy; `runtime s` is the median of the runtime's part of "
        "every step (passes and the gradient all-reduce, slowest rank); `sim s` is the "
        "simulator on the same schedules and `sim error` its error against that median; "
        "ratios are of median tokens/s, with their range over the pairings of runs.",
        "",
        "| policy | steps | tokens/step | tokens/s | runs | noise | vs static (range) | "
        "vs static-reference | runtime s | sim s | sim error | loss first -> last |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for policy, r in results.items():
        low, high = speedup_range(r, base)
        runs = ", ".join(f"{m.tokens_per_s:.0f}" for m in r.runs)
        lines.append(
            f"| {policy} | {len(r.first.losses)} | {r.first.tokens_per_step:.0f} | "
            f"{r.tokens_per_s:.0f} | {runs} | {r.noise_rel:.1%} | "
            f"{r.tokens_per_s / base.tokens_per_s:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{r.tokens_per_s / reference.tokens_per_s:.2f}x | {r.runtime_s:.1f} | "
            f"{r.predicted_s:.1f} | {r.sim_rel_err:.1%} | "
            f"{r.first.losses[0]:.3f} -> {r.first.losses[-1]:.3f} |"
        )
    lines += [
        "",
        f"Best DCP policy: `{summary['best_policy']}` at "
        f"{describe_speedup(summary, 'tuned static')}; "
        f"{summary['speedup_vs_static_reference']:.2f}x static-reference "
        f"(range {summary['speedup_vs_static_reference_min']:.2f}-"
        f"{summary['speedup_vs_static_reference_max']:.2f}x); simulator: "
        f"{summary['sim_predicted_speedup']:.2f}x static, largest error "
        f"{summary['sim_rel_err']:.1%} against the median (runtime noise "
        f"{summary['runtime_noise_rel']:.1%}).",
        "",
    ]
    if comparison.profiles > 1:
        lines[-1:-1] = [
            f"A probe found the profile off mid-comparison and it was measured again "
            f"({comparison.profiles} profiles): later runs planned with the new one.",
            "",
        ]
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
