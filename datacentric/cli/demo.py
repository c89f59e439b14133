"""``datacentric demo``: the main job of ``make demo``.

On two local gloo ranks: profile the tiny Llama on the standard-library corpus under
a memory cap that forces the longest files onto SP 2 or recomputation, then train the
same samples under ``static``, ``dcp-pac`` and ``dcp-opt``; print the plan and a
comparison table (measured tokens/s, speedup, loss, idle share, the simulator's
prediction) and write plots and a Perfetto trace of the measured steps under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datacentric.cli.bench import BENCH_DEFAULTS, bench_summary
from datacentric.cli.flags import add_world_flag
from datacentric.sim.plots import plot_loss_curves, plot_results
from datacentric.sim.trace import write_trace
from datacentric.train.config import load_config
from datacentric.train.measured_comparison import compare_policies
from datacentric.train.metrics import read_metrics

DEMO_POLICIES = ["static", "dcp-pac", "dcp-opt"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="profile, plan and train static vs DCP on CPU")
    parser.add_argument("--out", default="runs/demo", help="run folder")
    add_world_flag(parser, default=2, help="local gloo ranks", from_config=False)
    parser.add_argument(
        "--dataset-limit",
        type=int,
        default=None,
        help="corpus files used (one epoch of them per policy)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(BENCH_DEFAULTS, progress=True)
    if args.dataset_limit:
        settings["dataset_limit"] = args.dataset_limit
    config = load_config(None, out=str(out), **settings)
    print(
        f"datacentric demo: {config.model} on the standard-library corpus "
        f"({config.dataset_limit} files, chunks of <= {config.max_tokens} bytes), "
        f"{args.world} gloo ranks, memory cap {config.memory_gb} GiB per rank, "
        "one epoch per policy"
    )
    results = compare_policies(config, DEMO_POLICIES, args.world, out)
    summary = bench_summary(results, DEMO_POLICIES[0])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _print_plan(out / DEMO_POLICIES[-1] / "plan.json")
    base = results[DEMO_POLICIES[0]]
    header = (
        f"{'policy':<10} {'tokens/s':>9} {'speedup':>8} {'loss first->final':>18} "
        f"{'idle':>6} {'sim tokens/s':>13} {'sim speedup':>12} {'sim err':>8}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for policy, r in results.items():
        print(
            f"{policy:<10} {r.tokens_per_s:>9.0f} {r.tokens_per_s / base.tokens_per_s:>7.2f}x "
            f"{r.losses[0]:>8.3f} -> {r.losses[-1]:<7.3f} {r.measured_idle_share:>6.1%} "
            f"{r.predicted_tokens_per_s:>13.0f} "
            f"{r.predicted_tokens_per_s / base.predicted_tokens_per_s:>11.2f}x "
            f"{r.sim_rel_err:>8.1%}"
        )
    measured = {p: r.measured for p, r in results.items()}
    predicted = {p: r.predicted for p, r in results.items()}
    plot_results(measured, str(out / "measured.png"), "measured steps (2 gloo ranks)")
    plot_results(predicted, str(out / "simulated.png"), "simulated, same schedules")
    plot_loss_curves(
        {p: read_metrics(out / p) for p in results}, str(out / "loss.png"), "loss vs tokens"
    )
    events = write_trace(measured, str(out / "trace.json"))
    print(
        f"\nbest: {summary['best_policy']} at {summary['speedup']:.2f}x static "
        f"(simulator: {summary['sim_predicted_speedup']:.2f}x); wrote {out}/measured.png, "
        f"{out}/simulated.png, {out}/loss.png, {out}/trace.json ({events} events; open in "
        "ui.perfetto.dev), "
        f"{out}/summary.json"
    )
    not_learning = [p for p, r in results.items() if not r.losses[-1] < r.losses[0]]
    if not_learning:
        print(f"error: the loss did not go down under {', '.join(not_learning)}")
        return 1
    return 0


def _print_plan(path: Path) -> None:
    if not path.exists():
        return
    plan = json.loads(path.read_text(encoding="utf-8"))
    print(f"\nplan (cap {plan['memory_cap_bytes'] / 2**20:.0f} MiB per rank):")
    print(f"{'bucket':<10} {'sp':>3} {'batch':>6} {'recomputed':>11} {'est ms':>8} {'est MiB':>8}")
    for b in plan["buckets"]:
        print(
            f"{b['bucket']:<10} {b['sp_size']:>3} {b['micro_batch_size']:>6} "
            f"{b['num_recomputed']:>5}/{len(b['recompute']):<5} {b['est_time_s'] * 1e3:>8.1f} "
            f"{b['est_memory_bytes'] / 2**20:>8.1f}"
        )
