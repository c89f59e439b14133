"""``datacentric bench``: measured throughput of ``static`` and the DCP policies on the
same samples and steps, in one run, with the simulator's prediction beside it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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
)
from datacentric.cli.flags import enable_config_file
from datacentric.cli.precheck import check_dataset
from datacentric.cli.ranks import say
from datacentric.settings import TrainConfig, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure static vs DCP policies side by side, with the simulator's view"
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
        default=None,
        help="runs of each policy, interleaved (A B A B), for the spread between them (default: 2)",
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
    from datacentric.train.comparison_stop import ComparisonStopped
    from datacentric.train.machine_load import (
        busy_cores_now,
        cores,
        describe_start,
        load_average,
    )
    from datacentric.train.measured_comparison import DEFAULT_REPEATS, compare_policies

    repeats = DEFAULT_REPEATS if args.runs_per_policy is None else args.runs_per_policy
    if repeats < 1:
        print(f"datacentric bench: --runs-per-policy {repeats}: give at least 1", file=sys.stderr)
        return 2
    config = bench_config(args)
    prechecked = check_dataset(config, "bench")
    if prechecked is None:
        return 2
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    # stdout holds the summary alone; the load notes go to stderr
    print(
        f"datacentric bench: {describe_start(load_average(), cores(), busy_cores_now())}",
        file=sys.stderr,
    )
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
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    print(
        f"datacentric bench: {summary['best_policy']} at "
        f"{describe_speedup(summary, summary['baseline'])}; "
        f"{comparison.load.describe()}",
        file=sys.stderr,
    )
    return 0
