"""``datacentric demo``: the main job of ``make demo``.

On two local gloo ranks: profile the tiny Llama on the standard-library corpus under
a memory cap under which the longest files need SP 2 or recomputation (the plan says
whether they do), then train the same samples in the same global batches (one token
budget per optimizer step for every policy) under tuned ``static``,
``static-reference``, ``dcp-pac`` and ``dcp-opt``, side by side in one run, each policy
twice, interleaved (A B A B). The best policy's speedup is printed as the ratio of
medians with its range over the pairings of runs, and ``within noise`` when the range
includes 1.0; the first and last lines give the machine's load. The table
sets each policy's measured runtime beside the simulator's prediction for the same
steps, and the throughput ratios against ``static`` and ``static-reference``; plots
and a Perfetto trace of the measured steps go under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from datacentric.cli.comparison_report import BENCH_DEFAULTS, bench_summary, describe_speedup
from datacentric.cli.flag_groups import add_out_flag, add_world_flag, check_out_folder
from datacentric.cli.flags import config_option
from datacentric.cli.ranks import announce, command_world, say
from datacentric.progress import counted
from datacentric.settings import load_config
from datacentric.settings.command_defaults import COMPARISON_WORLD, command_default

if TYPE_CHECKING:
    from datacentric.settings import TrainConfig
    from datacentric.train.comparison.measured_comparison import PolicyRepeats

#: Tuned ``static`` first (the baseline of every ratio), the reference baseline, then DCP.
DEMO_POLICIES = ["static", "static-reference", "dcp-pac", "dcp-opt"]
#: Corpus files of the demo: one epoch of them per policy and run (10 files: 24 chunks,
#: 5 steps; bench keeps 12), so that two runs of each policy keep ``make demo`` near
#: five minutes on an idle machine (one run of each, on 12 files, took 2 min 53 s).
DEMO_DATASET_LIMIT = command_default("demo", "dataset_limit")
#: Steps of each run left out of the timing (the first pays one-off allocation costs).
DEMO_WARMUP = 1
#: Runs of each policy, interleaved (A B A B).
DEMO_REPEATS = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="profile, plan and train static vs DCP on CPU")
    add_out_flag(parser)
    add_world_flag(parser, note="local gloo ranks")
    config_option(
        parser, key="dataset_limit", note="here: corpus files, one epoch of them per policy"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # no torch: the first line comes at once
    from datacentric.train.comparison.machine_load import (
        busy_cores_now,
        cores,
        describe_start,
        load_average,
    )

    out = Path(check_out_folder(args.out))
    out.mkdir(parents=True, exist_ok=True)
    args.world = command_world(args.world, COMPARISON_WORLD)
    config = _demo_config(args, out)
    announce(
        "demo",
        f"{config.model.model} on the standard-library corpus "
        f"({counted(config.data.dataset_limit, 'file')}, chunks of <= "
        f"{config.data.max_tokens} bytes), "
        f"{counted(args.world, 'gloo rank')}, memory cap {config.cost.memory_gb} GiB per rank, "
        f"one epoch per policy, {DEMO_REPEATS} runs each (A B A B; {_how_long(args, config)}); "
        f"{describe_start(load_average(), cores(), busy_cores_now())}",
    )
    from datacentric.sim.plots import plot_loss_curves, plot_results
    from datacentric.sim.trace import write_trace
    from datacentric.train.comparison.comparison_stop import ComparisonStopped
    from datacentric.train.comparison.measured_comparison import compare_policies
    from datacentric.train.reporting.metrics import read_metrics

    try:
        comparison = compare_policies(
            config, DEMO_POLICIES, args.world, out, repeats=DEMO_REPEATS, warmup=DEMO_WARMUP
        )
    except ComparisonStopped as stop:
        say("demo", str(stop))
        return 128 + stop.signum
    results = comparison.policies
    summary = bench_summary(comparison, DEMO_POLICIES[0])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _print_plan(out / summary["best_policy"] / "plan.json")
    _print_table(results, config.scheduling.tokens_per_iteration)
    first = {p: r.first for p, r in results.items()}
    measured = {p: r.measured for p, r in first.items()}
    predicted = {p: r.predicted for p, r in first.items()}
    plot_results(measured, str(out / "measured.png"), f"measured steps ({args.world} gloo ranks)")
    plot_results(predicted, str(out / "simulated.png"), "simulated, same schedules")
    plot_loss_curves(
        {p: read_metrics(r.out) for p, r in first.items()}, str(out / "loss.png"), "loss vs tokens"
    )
    events = write_trace(measured, str(out / "trace.json"))
    print(
        f"\nwrote {out}/measured.png, "
        f"{out}/simulated.png, {out}/loss.png, {out}/trace.json ({events} events; open in "
        "ui.perfetto.dev; plots and trace from each policy's first run), "
        f"{out}/summary.json"
    )
    if comparison.profiles > 1:
        print(
            f"note: the profile was measured again mid-comparison ({comparison.profiles} "
            "profiles); each run is simulated with the one it planned with"
        )
    ref = summary.get("speedup_vs_static_reference")
    print(
        f"best: {summary['best_policy']} at {describe_speedup(summary, 'tuned static')}"
        + (
            f"; {ref:.2f}x static-reference (range {summary['speedup_vs_static_reference_min']:.2f}"
            f"-{summary['speedup_vs_static_reference_max']:.2f}x)"
            if ref
            else ""
        )
        + f"; simulator: {summary['sim_predicted_speedup']:.2f}x static, largest error "
        f"{summary['sim_rel_err']:.1%} against the median (runtime noise "
        f"{summary['runtime_noise_rel']:.1%}); loss curves equal: {summary['losses_equal']}"
    )
    not_learning = [p for p, r in first.items() if not r.losses[-1] < r.losses[0]]
    if not_learning:
        print(f"error: the loss did not go down under {', '.join(not_learning)}")
    print(f"machine: {comparison.load.describe()}")
    return 1 if not_learning else 0


def _demo_config(args: argparse.Namespace, out: Path) -> TrainConfig:
    """The demo's settings: :data:`BENCH_DEFAULTS` on ``args.world`` ranks with a progress
    bar, over ``--dataset-limit`` corpus files (:data:`DEMO_DATASET_LIMIT` unset), into
    ``out``."""
    limit = args.dataset_limit or DEMO_DATASET_LIMIT
    settings = dict(BENCH_DEFAULTS, world=args.world, progress=True, dataset_limit=limit)
    return load_config(None, out=str(out), **settings)


def _print_table(results: dict[str, PolicyRepeats], global_batch_tokens: int) -> None:
    """Median throughput per policy with its spread over the repeats, measured against
    simulated time, and throughput ratios (of medians) against tuned ``static`` and
    ``static-reference`` (all at one global batch)."""
    base = results["static"]
    reference = results.get("static-reference")
    print(
        f"\nglobal batch: {global_batch_tokens} tokens per optimizer step for every policy; "
        "times after the first step; medians over the runs, `noise` the largest "
        "difference between two runs of a policy"
    )
    header = (
        f"{'policy':<17} {'tok/step':>8} {'tokens/s':>8} {'noise':>6} {'runtime s':>9} "
        f"{'sim s':>7} {'sim err':>7} {'vs static':>9} {'vs ref':>7} {'sim vs static':>13} "
        f"{'loss first->final':>18} {'idle':>6}"
    )
    print(header + "\n" + "-" * len(header))
    for policy, r in results.items():
        vs_ref = f"{r.tokens_per_s / reference.tokens_per_s:>6.2f}x" if reference else f"{'-':>7}"
        first = r.first
        print(
            f"{policy:<17} {first.tokens_per_step:>8.0f} {r.tokens_per_s:>8.0f} "
            f"{r.noise_rel:>6.1%} {r.runtime_s:>9.2f} {r.predicted_s:>7.2f} "
            f"{r.sim_rel_err:>7.1%} {r.tokens_per_s / base.tokens_per_s:>8.2f}x {vs_ref} "
            f"{r.predicted_tokens_per_s / base.predicted_tokens_per_s:>12.2f}x "
            f"{first.losses[0]:>8.3f} -> {first.losses[-1]:<7.3f} "
            f"{first.measured_idle_share:>6.1%}"
        )


def _how_long(args: argparse.Namespace, config: TrainConfig) -> str:
    """How long the demo takes: measured at its defaults, else what it grows with."""
    world, files = COMPARISON_WORLD, DEMO_DATASET_LIMIT
    if (args.world, config.data.dataset_limit) == (world, files):
        return "about 4 minutes on an idle 2-core machine"
    return (
        f"how long grows with --world and --dataset-limit: about 4 minutes at --world {world} "
        f"and {counted(files, 'file')} on an idle 2-core machine"
    )


def _print_plan(path: Path) -> None:
    """The best policy's bucket plan, and whether the cap makes the longest bucket
    need SP above 1 or recomputation."""
    import numpy as np

    if not path.exists():
        return
    plan = json.loads(path.read_text(encoding="utf-8"))
    longest = max(plan["buckets"], key=lambda b: math.prod(np.atleast_1d(b["shape"])))
    plain = [o for o in longest["options"] if o["sp_size"] == 1 and "1" not in o["recompute"]]
    print(
        f"\nplan (cap {plan['memory_cap_bytes'] / 2**20:.0f} MiB per rank); the longest "
        f"bucket, {longest['bucket']}, "
        + (
            "fits on SP 1 without recomputation: the cap forces neither"
            if plain
            else "needs SP 2 or recomputation under this cap"
        )
        + ":"
    )
    print(f"{'bucket':<10} {'sp':>3} {'batch':>6} {'recomputed':>11} {'est ms':>8} {'est MiB':>8}")
    for b in plan["buckets"]:
        print(
            f"{b['bucket']:<10} {b['sp_size']:>3} {b['micro_batch_size']:>6} "
            f"{b['num_recomputed']:>5}/{len(b['recompute']):<5} {b['est_time_s'] * 1e3:>8.1f} "
            f"{b['est_memory_bytes'] / 2**20:>8.1f}"
        )
