"""Measured static vs DCP throughput on this machine's CPUs; writes cpu_bench.md.

    .venv/bin/python benchmarks/cpu_bench.py [--world 2] [--out-dir runs/cpu_bench]

Runs the comparison of ``datacentric demo`` (``datacentric.train.measured_comparison``):
tuned ``static``, ``static-reference``, ``dcp-pac`` and ``dcp-opt`` at one global batch,
one epoch of the same standard-library samples per policy, on ``--world`` gloo ranks, with
the tiny Llama, one dual-layer profile shared by all policies, and the simulator's
prediction for the very same schedules. Throughputs are measured side by side in one
run; the report also records how busy the machine was.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
from pathlib import Path

import torch

from datacentric.cli.bench import BENCH_DEFAULTS, bench_summary
from datacentric.cli.demo import DEMO_POLICIES, DEMO_WARMUP
from datacentric.train.config import load_config
from datacentric.train.measured_comparison import compare_policies

POLICIES = DEMO_POLICIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out-dir", default="runs/cpu_bench")
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    load_before = os.getloadavg()
    config = load_config(None, out=args.out_dir, **BENCH_DEFAULTS)
    results = compare_policies(config, POLICIES, args.world, args.out_dir, warmup=DEMO_WARMUP)
    summary = bench_summary(results, POLICIES[0])
    load_after = os.getloadavg()
    base = results[POLICIES[0]]
    reference = results["static-reference"]
    lines = [
        "# Static vs DCP, measured on CPU",
        "",
        f"Generated {dt.date.today().isoformat()} by `benchmarks/cpu_bench.py` on "
        f"{platform.machine()} with {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{args.world} gloo ranks (load average before {load_before[0]:.2f}, after "
        f"{load_after[0]:.2f}).",
        "",
        f"Model `{config.model}` on the first {config.dataset_limit} files of the "
        f"standard-library corpus (chunks of at most {config.max_tokens} bytes), memory cap "
        f"{config.memory_gb} GiB per rank (the longest chunks need recomputation), model "
        f"state held as `shard = {config.shard}`, one global batch of "
        f"{config.tokens_per_iteration} tokens per optimizer step for "
        "every policy (the same samples in the same steps, so the loss curves agree: "
        f"`losses_equal` {summary['losses_equal']}). One epoch per policy, the same initial "
        "weights; the cost model is one dual-layer profile measured in the first run. Times "
        f"leave out each run's first {DEMO_WARMUP} step(s). `runtime s` is the runtime's "
        "part of every step (passes and the gradient all-reduce, slowest rank); `sim s` is "
        "the simulator on the same schedules; ratios are measured tokens/s.",
        "",
        "| policy | steps | tokens/step | tokens/s | vs static | vs static-reference | "
        "runtime s | sim s | sim error | measured idle | loss first -> last |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for policy, r in results.items():
        lines.append(
            f"| {policy} | {len(r.losses)} | {r.tokens_per_step:.0f} | {r.tokens_per_s:.0f} | "
            f"{r.tokens_per_s / base.tokens_per_s:.2f}x | "
            f"{r.tokens_per_s / reference.tokens_per_s:.2f}x | {r.runtime_s:.1f} | "
            f"{r.predicted_s:.1f} | {r.sim_rel_err:.1%} | {r.measured_idle_share:.1%} | "
            f"{r.losses[0]:.3f} -> {r.losses[-1]:.3f} |"
        )
    lines += [
        "",
        f"Best DCP policy: `{summary['best_policy']}` at {summary['speedup']:.2f}x tuned "
        f"static and {summary['speedup_vs_static_reference']:.2f}x static-reference "
        f"(simulator: {summary['sim_predicted_speedup']:.2f}x static); largest simulator error "
        f"{summary['sim_rel_err']:.1%}.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
