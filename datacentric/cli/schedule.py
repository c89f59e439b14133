"""``datacentric schedule``: build one epoch's schedule and report how good it is.

The dataset is ``--dataset NAME`` (``stdlib`` or a workload preset) or ``--lengths
FILE``; costs come from a saved profile (``--profile-dir DIR``, its fitted cost model) or
an analytic preset (``--model PRESET --hardware PRESET``; a workload preset brings
its own defaults). The planner plans every bucket first (its knapsack recomputation
is one of the choices ``dcp-pac`` and ``dcp-opt`` use). Prints a summary, or one
JSON object with ``--json``; ``--json-out FILE`` saves the schedule itself as JSON.
With several policies (``--policy static,dcp-opt``) every policy schedules the same
data on the same plan, and the JSON object holds ``policies`` keyed by name (as
``datacentric simulate --json`` does).
Settings may come from ``--config FILE`` (the keys of its flags; flags override it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_global_batch_flags,
    add_hardware_flag,
    add_json_flag,
    add_json_out_flag,
    add_model_flags,
    add_policy_flag,
    add_skip_unfittable_flag,
    add_split_mode_flag,
    add_world_flag,
    json_text,
    limit_splits,
)
from datacentric.cli.flags import add_deprecated_alias, config_option, enable_config_file
from datacentric.cli.planning_inputs import (
    add_cost_model_arguments,
    analytic_model,
    command_pipeline,
    dataset_shapes,
    global_batch_options,
    profiled_model,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schedule",
        help="build an epoch's schedule with a policy and report its efficiency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataset_flags(parser, exclusive=True)
    add_world_flag(parser, required=True)
    add_policy_flag(parser, several=True)
    config_option(parser, "--profile", key="profile_dir")
    add_model_flags(parser, note="an analytic preset")
    add_hardware_flag(parser, note="default: the workload's")
    add_cost_model_arguments(parser)
    config_option(parser, "--seed", key="seed", type=int)
    parser.add_argument("--epoch", type=int, default=0, help="epoch number (orders the samples)")
    add_global_batch_flags(parser)
    add_split_mode_flag(parser)
    config_option(
        parser, "--drop-remainder", key="drop_remainder", action=argparse.BooleanOptionalAction
    )
    config_option(parser, "--max-sp", key="max_sp_size", type=int)
    config_option(
        parser, "--exact-solver", key="exact_solver", action=argparse.BooleanOptionalAction
    )
    add_deprecated_alias(
        parser, "--no-exact", "--no-exact-solver", "exact_solver", nargs=0, const=False
    )
    add_skip_unfittable_flag(parser)
    add_json_out_flag(parser, note="here: the schedule")
    add_json_flag(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


def cost_model_and_source(args: argparse.Namespace) -> tuple[Any, str]:
    """The cost model (profile or analytic) and where it came from."""
    if args.profile:
        cost, _ = profiled_model(args)
        return limit_splits(cost, args), f"profile {args.profile}"
    model, hardware = args.model, args.hardware
    from datacentric.data.workloads import get_workload, list_workloads

    name = "stdlib-code" if args.dataset == "stdlib" else args.dataset
    if name in list_workloads() and not (model and hardware):  # the preset's defaults
        preset = get_workload(name, seed=args.seed, num_samples=100)
        model, hardware = model or preset.model, hardware or preset.hardware
    if not (model and hardware):
        raise ValueError("give --profile DIR, or --model PRESET --hardware PRESET")
    cost = limit_splits(analytic_model(model, hardware, args.world, args), args)
    return cost, f"analytic {model} on {hardware}"


def schedule_summary(args: argparse.Namespace) -> dict[str, Any]:
    """Build the schedule(s) the arguments describe; the summary as a JSON-able dict:
    one policy's fields, or with several policies ``policies`` keyed by name (one plan,
    one pipeline, every policy on the same global batches)."""
    from datacentric.progress import Progress
    from datacentric.settings import SchedulingConfig

    policies = [p for p in args.policy.split(",") if p]
    if len(policies) > 1 and args.json_out:
        raise ValueError("--json-out saves one schedule: give one --policy")
    batch = global_batch_options(args)
    with Progress(f"schedule on {args.world} ranks", 2, unit="stage") as bar:
        bar.set_stage("the dataset and the cost model")
        shapes, skipped = dataset_shapes(args)
        cost, source = cost_model_and_source(args)
        options = SchedulingConfig(
            **batch,
            drop_remainder=args.drop_remainder,
            max_sp_size=args.max_sp,
            exact_solver=args.exact_solver,
        )
        pipeline = command_pipeline(args, shapes, cost, args.world, options=options, seed=args.seed)
        bar.update(stage=f"planning {len(shapes):,} samples")
        pipeline.plan  # noqa: B018 - made once here, so the stages show
        bar.update()
    rows = {}
    for policy in policies:  # each policy's steps, out of the epoch's, with time left
        with Progress(f"schedule {policy} steps", 1, unit="step", time_left=True) as steps:
            rows[policy] = policy_summary(
                args, policy, pipeline, source, skipped, on_step=steps.reached
            )
    if len(policies) == 1:
        return rows[policies[0]]
    shared = ("world", "cost_model", "samples_total", "samples_skipped", "tokens_per_step_mean")
    first = rows[policies[0]]
    return {
        **{key: first[key] for key in shared},
        "global_batch_tokens": batch["global_batch_tokens"],
        "policies": {p: {k: v for k, v in row.items() if k != "policy"} for p, row in rows.items()},
    }


def policy_summary(
    args: argparse.Namespace,
    policy: str,
    pipeline: Any,
    source: str,
    skipped: int,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """One policy's schedule from the command's pipeline, built and validated; its
    summary fields. ``on_step``: told the steps scheduled (a progress line)."""
    shapes = pipeline.shapes
    schedule = pipeline.schedule(args.epoch, policy=policy, on_step=on_step)
    schedule.validate()
    if args.json_out:
        schedule.save(args.json_out)
    meta = schedule.meta
    groups = [len(it.assignments) for it in schedule.iterations]
    splits: dict[tuple[int, int], int] = {}
    for it in schedule.iterations:
        for group in it.assignments:
            for split in group.splits:
                splits[split] = splits.get(split, 0) + 1
    return {
        "policy": policy,
        "world": args.world,
        "cost_model": source,
        "iterations": len(schedule.iterations),
        "samples_total": len(shapes),
        "samples_scheduled": schedule.samples_scheduled,
        "samples_dropped": meta["samples_dropped"],
        "samples_skipped": skipped,
        "efficiency": meta["efficiency"],
        "efficiency_makespan_only": meta["efficiency_makespan_only"],
        "efficiency_step_bound": meta["efficiency_step_bound"],
        "efficiency_old_bound": meta["efficiency_old_bound"],
        "settings": meta["settings"],
        "tokens_per_step_mean": meta["tokens_per_step_mean"],
        "tokens_per_step_max": meta["tokens_per_step_max"],
        "imbalance_mean": meta["imbalance_mean"],
        "imbalance_max": max(meta["imbalance"]),
        "est_epoch_time_s": meta["est_epoch_time_s"],
        "ideal_epoch_time_s": meta["ideal_epoch_time_s"],
        "ideal_epoch_time_old_s": meta["ideal_epoch_time_old_s"],
        "step_bound_epoch_time_s": meta["step_bound_epoch_time_s"],
        "grad_sync_exposed_s": meta["grad_sync_exposed_s"],
        "plan_seconds": meta["plan_seconds"],
        "groups_per_iteration_mean": sum(groups) / len(groups),
        "phases_per_iteration_max": max(it.num_phases for it in schedule.iterations),
        "sp_splits": [[u, r, n] for (u, r), n in sorted(splits.items())],
        "out": args.json_out,
    }


def run(args: argparse.Namespace) -> int:
    from datacentric.planning.planner import UnfittableBucketError
    from datacentric.profiling.store import ProfileError

    try:
        summary = schedule_summary(args)
    except (ProfileError, UnfittableBucketError, ValueError, KeyError, OSError) as err:
        print(f"datacentric schedule: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json_text(summary))
        return 0
    for name, row in summary.get("policies", {"": summary}).items():
        if name:
            print(f"{'policy':>26}: {name}")
        for key, value in row.items():
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"{key:>26}: {shown}")
    return 0
