"""``datacentric bench``: measured throughput of ``static`` and the DCP policies on the
same samples and steps, in one run, with the simulator's prediction beside it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from datacentric.cli.comparison_report import BENCH_DEFAULTS, bench_summary, describe_speedup
from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_json_flag,
    add_memory_flags,
    add_model_flags,
    add_out_flag,
    add_policy_flag,
    add_shard_flags,
    add_world_flag,
    check_out_folder,
)
from datacentric.cli.flags import enable_config_file
from datacentric.cli.precheck import check_dataset
from datacentric.cli.ranks import command_world, say
from datacentric.progress import counted
from datacentric.settings import TrainConfig, load_config
from datacentric.settings.command_defaults import COMPARISON_WORLD

KEY = """\
Reading the output. The headline, per policy: its timed steps' measured wall time (the
median over its runs) and throughput, beside the simulator's time for the same steps;
then the best DCP policy against the baseline (the first --policy): the ratio of median
throughputs, its range over every pairing of runs, the largest spread between one
policy's runs (noise) and the verdict (within noise when the range holds 1.0 or the
ratio is inside the noise). No ideal bound is measured: `datacentric schedule` and
`simulate` give a policy's efficiency against it. The table:
  tok/s        median measured tokens per second (policies)
  noise        largest relative spread of step times between its runs (noise_rel)
  sim err      |simulated - measured| / measured of the runtime's part of the steps
               (sim_rel_err)
  idle         share of GPU time idle, measured / estimated by the schedule
               (measured_idle_share / est_idle_share)
  loss         the first and the final loss of its first run (first_loss, final_loss)
--json prints every field (also saved as OUT/summary.json): baseline, best_policy,
repeats, speedup, speedup_min, speedup_max, noise_rel, verdict, sim_predicted_speedup
(the simulator's ratio for the same policies), sim_rel_err, runtime_noise_rel (the spread
of the runtime's part alone), losses_equal (every run's loss curve the same),
load_average, cpu_share, under_load, load, profiles, world, when static-reference
ran speedup_vs_static_reference, speedup_vs_static_reference_min and
speedup_vs_static_reference_max, and details per policy: tokens, steps,
tokens_per_step_mean, tokens_per_s, tokens_per_s_runs, measured_s_runs,
runtime_s_runs, noise_rel, runtime_noise_rel, predicted_s, sim_rel_err, first_loss,
final_loss, measured_idle_share, est_idle_share and folders.
"""

#: Runs of each policy by default: two, for the spread between them.
RUNS_PER_POLICY = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure static vs DCP policies side by side, with the simulator's view",
        description=__doc__,
        epilog=KEY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_world_flag(parser, note="local gloo ranks")
    add_policy_flag(parser, several=True, note="; the first is the baseline")
    add_out_flag(parser)
    add_model_flags(parser, note="a runnable preset")
    add_dataset_flags(parser, lengths=False)
    add_memory_flags(parser, fraction=False)
    add_shard_flags(parser, reshard=False)
    parser.add_argument(
        "--runs-per-policy",
        type=int,
        default=RUNS_PER_POLICY,
        help="runs of each policy, interleaved (A B A B), for the spread between them "
        f"(default: {RUNS_PER_POLICY})",
    )
    add_json_flag(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


def bench_config(args: argparse.Namespace) -> TrainConfig:
    """The settings every policy's run starts from: :data:`BENCH_DEFAULTS`, then each
    settings flag of the command, in either spelling (``--lora.rank`` or ``--lora-rank``)
    or as its key in ``--config`` (``[lora] rank``), none left out (``--policy``, a list
    to compare, is set per run)."""
    overrides = dict(BENCH_DEFAULTS)
    for action in args.config_options:
        value = getattr(args, action.dest)
        if value is not None and not getattr(action, "config_list", False):
            overrides[action.config_key] = value
    return load_config(None, **overrides)


def run(args: argparse.Namespace) -> int:
    from datacentric.train.comparison.machine_load import (
        busy_cores_now,
        cores,
        describe_start,
        load_average,
    )

    repeats = args.runs_per_policy
    if repeats < 1:
        print(f"datacentric bench: --runs-per-policy {repeats}: give at least 1", file=sys.stderr)
        return 2
    check_out_folder(args.out)
    args.world = command_world(args.world, COMPARISON_WORLD)
    config = bench_config(args)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    # stdout holds the summary alone; the first line and the load notes go to stderr,
    # before torch loads
    print(
        f"datacentric bench: {start_line(args, config, policies, repeats)}; "
        f"{describe_start(load_average(), cores(), busy_cores_now())}",
        file=sys.stderr,
        flush=True,
    )
    from datacentric.train.comparison.comparison_stop import ComparisonStopped
    from datacentric.train.comparison.measured_comparison import compare_policies

    prechecked = check_dataset(config, "bench")
    if prechecked is None:
        return 2
    try:
        comparison = compare_policies(
            config, policies, args.world, args.out, repeats=repeats, prechecked=prechecked
        )
    except ComparisonStopped as stop:
        say("bench", str(stop))
        return 128 + stop.signum
    summary = bench_summary(comparison, policies[0])
    summary["world"] = args.world
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(
        json.dumps(summary, indent=2) + "\n", encoding="utf-8"
    )
    print(json.dumps(summary) if args.json else human_summary(summary))
    print(
        f"datacentric bench: {summary['best_policy']} at "
        f"{describe_speedup(summary, summary['baseline'])}; "
        f"{comparison.load.describe()}",
        file=sys.stderr,
    )
    return 0


def start_line(
    args: argparse.Namespace, config: TrainConfig, policies: list[str], repeats: int
) -> str:
    """What ``bench`` will do, said before torch loads: the policies, the data, the ranks
    and the runs, and what its time grows with (no run of it was timed at every input)."""
    interleaved = " (A B A B)" if repeats > 1 else ""
    return (
        f"{', '.join(policies)} with {config.model.model} on {config.data.dataset}, "
        f"{counted(args.world, 'gloo rank')}, one epoch per policy, {counted(repeats, 'run')} "
        f"each{interleaved}, into {args.out}; loading torch and checking the data first (how "
        "long grows with the model, the data, --world and --runs-per-policy)"
    )


def human_summary(summary: dict[str, Any]) -> str:
    """What ``bench`` prints without ``--json``: per policy a headline (its measured time
    and throughput beside the simulator's time), the speedup line, a short table and
    whether the losses agree; :data:`KEY` explains each figure."""
    details = summary["details"]
    lines = [
        f"{p}: {counted(d['steps'], 'step')} in "
        f"{statistics.median(d['measured_s_runs']):,.2f} s measured (median of "
        f"{counted(len(d['measured_s_runs']), 'run')}), {d['tokens_per_s']:,.0f} tokens/s; "
        f"simulated {d['predicted_s']:,.2f} s"
        for p, d in details.items()
    ]
    lines.append(
        f"{summary['best_policy']} at {describe_speedup(summary, summary['baseline'])}; "
        f"simulated {summary['sim_predicted_speedup']:.2f}x"
    )
    lines.append("")
    lines.append(f"{'policy':<18}{'tok/s':>10}{'noise':>8}{'sim err':>9}{'idle':>14}{'loss':>16}")
    for p, d in details.items():
        idle = f"{d['measured_idle_share']:.0%} / {d['est_idle_share']:.0%}"
        loss = f"{d['first_loss']:.3f} -> {d['final_loss']:.3f}"
        lines.append(
            f"{p:<18}{d['tokens_per_s']:>10,.0f}{d['noise_rel']:>8.1%}{d['sim_rel_err']:>9.1%}"
            f"{idle:>14}{loss:>16}"
        )
    lines.append(f"losses equal across policies: {'yes' if summary['losses_equal'] else 'no'}")
    lines.append("each figure: datacentric bench --help; every field: --json")
    return "\n".join(lines)
