"""Reproduce the DCP paper's and blog's results in the simulator; writes paper_reproduction.md.

    .venv/bin/python benchmarks/paper_reproduction.py            # full run
    .venv/bin/python benchmarks/paper_reproduction.py --quick    # 1/10 of the samples

Every number in the written file is measured by this script: the Open-Sora presets are
scheduled by every policy (``datacentric.scheduling.build_schedule``) and the schedules
executed by the simulator on the analytic cost model. The blog's and paper's figures are
quoted beside ours (from ``docs/simulator.md`` / the method notes), never used as inputs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import time
from pathlib import Path

from datacentric.data.workloads import get_workload
from datacentric.sim.policy_comparison import (
    DEFAULT_POLICIES,
    policy_table,
    run_policies,
    simulation_cost_model,
)

PRESETS = ("opensora-short", "opensora-balanced", "opensora-long")
LABELS = {
    "opensora-short": "short-dominated",
    "opensora-balanced": "balanced",
    "opensora-long": "long-dominated",
}

# Blog, 32 x H100, Open-Sora v1.2: throughput in M tokens/s (speedup over the baseline).
BLOG_32_H100 = {
    "opensora-short": {"static": 0.90, "dcp-intra": 1.40, "dcp-inter": 1.92, "dcp-pac": 2.24},
    "opensora-balanced": {"static": 1.16, "dcp-intra": 1.42, "dcp-inter": 1.95, "dcp-pac": 2.06},
    "opensora-long": {"static": 1.54, "dcp-intra": 1.64, "dcp-inter": 1.96, "dcp-pac": 1.97},
}
BLOG_SPEEDUP = {"opensora-short": 2.48, "opensora-balanced": 1.78, "opensora-long": 1.28}
# Blog: estimated imbalance (idle share) at 8 / 16 / 32 GPUs.
BLOG_IDLE = {
    "static": (0.088, 0.138, 0.164),
    "dcp-intra": (0.052, 0.052, 0.053),
    "dcp-inter": (0.024, 0.039, 0.043),
    "dcp-pac": (0.012, 0.017, 0.033),
}
TEXT_PRESETS = ("stdlib-code", "sft-longtail")
PAPER_H200_HEADLINE = 2.88
TOLERANCE = 0.25
SCALING_GPUS = (8, 16, 32, 64, 128)


def measure(preset: str, gpus: int, hardware: str, num_samples: int | None) -> dict:
    workload = get_workload(preset, seed=0, num_samples=num_samples)
    cost_model = simulation_cost_model(workload.model, hardware, gpus)
    start = time.perf_counter()
    errors: dict[str, str] = {}
    runs = run_policies(workload.shapes, cost_model, gpus, DEFAULT_POLICIES, errors=errors)
    for policy, error in errors.items():
        ERRORS.append(f"{preset}, {gpus} x {hardware}, {policy}: {error}")
    return {
        "table": policy_table(runs),
        "seconds": time.perf_counter() - start,
        "samples": len(workload.shapes),
    }


ERRORS: list[str] = []
"""Policies that failed to schedule or simulate (reported in the file, never hidden)."""


def get(table: dict, policy: str, key: str) -> float | None:
    """``table[policy][key]``, or None when the policy failed or the value is missing."""
    row = table.get(policy)
    return None if row is None else row.get(key)


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "error" if value is None else f"{value:{spec}}{suffix}"


def fmt_speed(table: dict, policy: str) -> str:
    tps = get(table, policy, "tokens_per_s")
    if tps is None:
        return "error"
    return f"{tps / 1e6:.2f} ({fmt(get(table, policy, 'speedup_vs_static'), '.2f', 'x')})"


def main_table(results: dict) -> list[str]:
    lines = [
        "| distribution | source | static | megatron-dyncp | dcp-intra | dcp-inter | dcp-pac "
        "| dcp-opt |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        blog = BLOG_32_H100[preset]
        cells = []
        for policy in DEFAULT_POLICIES:
            if policy in blog:
                cells.append(f"{blog[policy]:.2f} ({blog[policy] / blog['static']:.2f}x)")
            else:
                cells.append("-")
        lines.append(f"| {LABELS[preset]} | blog | " + " | ".join(cells) + " |")
        table = results[preset]["table"]
        ours = " | ".join(fmt_speed(table, p) for p in DEFAULT_POLICIES)
        lines.append(f"| {LABELS[preset]} | ours | {ours} |")
    return lines


def detail_table(results: dict) -> list[str]:
    lines = [
        "| distribution | policy | iterations | idle share | efficiency | recompute share "
        "| all-to-all share | grad-sync share | schedule s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        for policy, row in results[preset]["table"].items():
            lines.append(
                f"| {LABELS[preset]} | {policy} | {row['iterations']} | {row['idle_share']:.1%} "
                f"| {row['efficiency']:.3f} | {row['recompute_share']:.1%} "
                f"| {row['comm_share']:.1%} | {row['grad_sync_share']:.1%} "
                f"| {row['schedule_seconds']:.1f} |"
            )
    return lines


def checks(results: dict) -> list[str]:
    lines = []
    all_ok = True
    for preset in PRESETS:
        table = results[preset]["table"]
        ours, blog = get(table, "dcp-pac", "speedup_vs_static"), BLOG_SPEEDUP[preset]
        if ours is None:
            all_ok = False
            lines.append(f"- {LABELS[preset]}: dcp-pac failed: FAIL")
            continue
        rel = ours / blog - 1
        ok = abs(rel) <= TOLERANCE
        all_ok &= ok
        lines.append(
            f"- {LABELS[preset]}: dcp-pac {ours:.2f}x vs blog {blog:.2f}x "
            f"({rel:+.0%}, tolerance {TOLERANCE:.0%}): {'PASS' if ok else 'FAIL'}"
        )
    for preset in PRESETS:
        table = results[preset]["table"]
        opt, pac = table.get("dcp-opt"), table.get("dcp-pac")
        if opt is None or pac is None:
            all_ok = False
            lines.append(f"- {LABELS[preset]}: dcp-opt or dcp-pac failed: FAIL")
            continue
        ok = opt["tokens_per_s"] >= pac["tokens_per_s"] and opt["efficiency"] >= 0.90
        all_ok &= ok
        lines.append(
            f"- {LABELS[preset]}: dcp-opt {opt['speedup_vs_static']:.2f}x >= dcp-pac "
            f"{pac['speedup_vs_static']:.2f}x and efficiency {opt['efficiency']:.3f} >= 0.90: "
            f"{'PASS' if ok else 'FAIL'}"
        )
    lines.append(f"- overall: {'PASS' if all_ok else 'FAIL'}")
    return lines


def scaling_tables(scaling: dict) -> list[str]:
    lines = [
        "| distribution | GPUs | static M tok/s | megatron-dyncp | dcp-intra | dcp-inter "
        "| dcp-pac | dcp-opt | dcp-opt efficiency |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        for gpus in SCALING_GPUS:
            table = scaling[preset][gpus]["table"]
            speedups = " | ".join(
                fmt(get(table, p, "speedup_vs_static"), ".2f", "x") for p in DEFAULT_POLICIES[1:]
            )
            static = get(table, "static", "tokens_per_s")
            lines.append(
                f"| {LABELS[preset]} | {gpus} | {fmt(static and static / 1e6, '.2f')} "
                f"| {speedups} | {fmt(get(table, 'dcp-opt', 'efficiency'), '.3f')} |"
            )
    lines += [
        "",
        "Idle share (imbalance) at 8 / 16 / 32 GPUs, ours (mean over the three distributions) "
        "vs the blog's estimate:",
        "",
        "| policy | ours 8 | ours 16 | ours 32 | blog 8 | blog 16 | blog 32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy in DEFAULT_POLICIES:
        ours = []
        for g in (8, 16, 32):
            values = [get(scaling[p][g]["table"], policy, "idle_share") for p in PRESETS]
            ours.append(None if None in values else sum(values) / len(values))
        blog = BLOG_IDLE.get(policy)
        blog_cells = " | ".join(f"{x:.1%}" for x in blog) if blog else "- | - | -"
        cells = " | ".join(fmt(x, ".1%") for x in ours)
        lines.append(f"| {policy} | {cells} | {blog_cells} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/10 of the samples")
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    num_samples = 10_200 if args.quick else 102_000
    started = time.perf_counter()
    scaling: dict = {p: {} for p in PRESETS}
    for preset in PRESETS:
        for gpus in SCALING_GPUS:
            samples = num_samples * max(1, gpus // 32)  # weak scaling past 32 GPUs
            scaling[preset][gpus] = measure(preset, gpus, "h100-sxm", samples)
            row = scaling[preset][gpus]["table"]
            print(
                f"{preset} {gpus} GPUs: "
                + ", ".join(f"{p} {fmt(row[p]['speedup_vs_static'], '.2f', 'x')}" for p in row),
                flush=True,
            )
    at32 = {p: scaling[p][32] for p in PRESETS}
    h200 = {p: measure(p, 32, "h200-sxm", num_samples) for p in PRESETS}
    text = {p: measure(p, 32, "h200-sxm", None) for p in TEXT_PRESETS}
    total = time.perf_counter() - started
    write_report(args.out, at32, scaling, h200, text, num_samples, total)
    print(f"wrote {args.out} in {total:.0f} s")


def text_table(text: dict) -> list[str]:
    lines = [
        "| workload | samples | " + " | ".join(DEFAULT_POLICIES) + " | dcp-opt efficiency |",
        "|---|---|" + "---|" * (len(DEFAULT_POLICIES) + 1),
    ]
    for preset, measured in text.items():
        table = measured["table"]
        cells = " | ".join(fmt_speed(table, p) for p in DEFAULT_POLICIES)
        eff = fmt(get(table, "dcp-opt", "efficiency"), ".3f")
        lines.append(f"| {preset} | {measured['samples']} | {cells} | {eff} |")
    return lines


def write_report(path: str, at32, scaling, h200, text, num_samples, seconds) -> None:
    samples = at32[PRESETS[0]]["samples"]
    h200_rows = [
        f"| {LABELS[p]} | {fmt(get(h200[p]['table'], 'dcp-pac', 'speedup_vs_static'), '.2f', 'x')} "
        f"| {fmt(get(h200[p]['table'], 'dcp-opt', 'speedup_vs_static'), '.2f', 'x')} "
        f"| {fmt_speed(h200[p]['table'], 'static')} |"
        for p in PRESETS
    ]

    def best_of(policy: str) -> str:
        values = [get(h200[p]["table"], policy, "speedup_vs_static") for p in PRESETS]
        return fmt(max((v for v in values if v is not None), default=None), ".2f", "x")

    text = [
        "# Paper reproduction in the simulator",
        "",
        f"Generated {dt.date.today().isoformat()} by `benchmarks/paper_reproduction.py`"
        f"{' --quick' if num_samples < 102_000 else ''} in {seconds:.0f} s on {platform.machine()} "
        f"(Python {platform.python_version()}).",
        "",
        "Setup: workload presets `opensora-short`, `opensora-balanced`, `opensora-long` "
        f"({samples} samples each; definitions in `docs/simulator.md`), model `stdit-1.1b`, "
        "analytic cost model (`datacentric.planning.analytic`) with the settings of "
        "`datacentric.sim.policy_comparison.simulation_cost_model` (bf16, 70% memory cap, ZeRO-2 "
        "states; the gradient all-reduce overlaps the last backward of the slowest group), "
        "one epoch per policy, seed 0, every policy on the same plan and options. Throughput "
        "is latent-patch tokens per second; speedups are over our `static` on the same data.",
        "",
        "## 32 x H100: the blog's table beside ours",
        "",
        "M tokens/s (speedup over static). The blog's `dcp-pac` column is its DCP-inter+PAC; "
        "it has no `megatron-dyncp` or `dcp-opt`.",
        "",
        *main_table(at32),
        "",
        "Done-when checks:",
        "",
        *checks(at32),
        "",
        "Details at 32 x H100 (shares are of GPU busy time; grad-sync share is of epoch time):",
        "",
        *detail_table(at32),
        "",
        "## 32 x H200: the paper's headline",
        "",
        f"The paper reports up to {PAPER_H200_HEADLINE:.2f}x on 32 H200. Ours, best over the "
        f"three distributions: dcp-pac {best_of('dcp-pac')}, dcp-opt {best_of('dcp-opt')}.",
        "",
        "| distribution | dcp-pac | dcp-opt | static M tok/s |",
        "|---|---|---|---|",
        *h200_rows,
        "",
        "## Text workloads, 32 x H200, llama-7b",
        "",
        "M tokens/s (speedup over static), full presets. `stdlib-code` is one pass over the "
        "corpus's 739 files (a few iterations per policy, so the last iteration weighs a lot); "
        "`sft-longtail` is 99.89% short samples, where a fixed configuration is already close "
        "to ideal.",
        "",
        *text_table(text),
        "",
        "## Scaling on H100 (speedup over static at each size)",
        "",
        f"{num_samples} samples up to 32 GPUs; past 32, {num_samples} x GPUs / 32 (weak "
        "scaling, so that an epoch keeps as many iterations as at 32 GPUs and the last, "
        "partial iteration does not dominate).",
        "",
        *scaling_tables(scaling),
        "",
        "## Failures",
        "",
        *([f"- {e}" for e in ERRORS] or ["None: every policy scheduled and simulated."]),
        "",
    ]
    Path(path).write_text("\n".join(text), encoding="utf-8")


if __name__ == "__main__":
    main()
