"""``datacentric plan``: per bucket, its options and the preferred one (SP size,
micro-batch size and recomputation: ``Plan.preferred``).

From a saved profile (``--profile-dir DIR``: the plan saved there, or a new plan of the
dataset given with ``--dataset``/``--lengths`` on the profile's fitted cost model), or
from an analytic preset (``--model PRESET --hardware PRESET``). Prints a table, or
one JSON object with ``--json``. Settings may come from ``--config FILE`` (the keys of
its flags; flags override it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_hardware_flag,
    add_json_flag,
    add_model_flags,
    add_skip_unfittable_flag,
    add_world_flag,
)
from datacentric.cli.flags import config_option, enable_config_file
from datacentric.cli.plan_table import TABLE_KEY, format_table, plan_json
from datacentric.cli.planning_inputs import (
    add_cost_model_arguments,
    analytic_model,
    command_pipeline,
    dataset_shapes,
    model_and_hardware,
    profiled_model,
)
from datacentric.planning.plan import Plan
from datacentric.shapes import Bucketing


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the per-bucket plan of a profile or of an analytic preset",
        description=__doc__,
        epilog=TABLE_KEY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_option(parser, "--profile", key="profile_dir", metavar="DIR")
    add_model_flags(parser, note="an analytic preset, with --hardware")
    add_hardware_flag(parser, note="analytic, with --model")
    add_dataset_flags(parser)
    add_world_flag(parser)
    add_cost_model_arguments(parser)
    config_option(
        parser,
        "--max-micro-batch",
        key="max_micro_batch_size",
        dest="max_micro_batch",
    )
    add_skip_unfittable_flag(parser)
    config_option(parser, "--seed", key="seed", type=int)
    add_json_flag(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.planning.planner import UnfittableBucketError
    from datacentric.profiling.store import ProfileError

    try:
        plan, bucketing, source, cost = _make_plan(args)
    except (ProfileError, UnfittableBucketError, ValueError, KeyError) as err:
        print(f"datacentric plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        out = {
            "source": source,
            "world": plan.world_size,
            "memory_cap_bytes": plan.memory_cap_bytes,
            "num_blocks": plan.num_blocks,
            "buckets": plan_json(plan, bucketing, cost),
            "skipped": plan.skipped,
        }
        print(json.dumps(out))
    else:
        print(f"plan from {source}")
        print(format_table(plan, bucketing, cost))
    return 0


def _make_plan(args: argparse.Namespace) -> tuple[Plan, Bucketing | None, str, Any]:
    from datacentric.profiling.store import load_plan

    has_data = bool(args.dataset or args.lengths)
    if args.profile:
        cost, world = profiled_model(args)
        if not has_data:
            return load_plan(args.profile), None, f"saved plan in {args.profile}", cost
        source = f"profile {args.profile}"
    else:
        model, hardware = model_and_hardware(args)  # a workload preset's, where unset
        missing = [
            *([] if model else ["--model PRESET"]),
            *([] if hardware else ["--hardware PRESET"]),
            *([] if args.world else ["--world N"]),
            *([] if has_data else ["--dataset NAME (or --lengths FILE)"]),
        ]
        if missing:
            preset = "" if model and hardware else " (a workload preset --dataset names both)"
            raise ValueError(f"give {', '.join(missing)}{preset}, or --profile-dir DIR")
        cost, world = analytic_model(model, hardware, args.world, args), args.world
        source = f"analytic {model} on {hardware}"
    from datacentric.settings import SchedulingConfig

    # the plan schedule and train make: its options bounded by [scheduling]
    # max_micro_batch_size (--max-micro-batch-size)
    options = SchedulingConfig(max_micro_batch_size=args.max_micro_batch)
    shapes = dataset_shapes(args)[0]
    pipeline = command_pipeline(args, shapes, cost, args.world or world, options=options)
    return pipeline.plan, pipeline.bucketing, source, cost
