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
    add_memory_flags,
    add_model_flags,
    add_shard_flags,
    add_skip_unfittable_flag,
    add_world_flag,
    lora_of_args,
)
from datacentric.cli.flags import config_option, enable_config_file
from datacentric.planning.hardware import GIB
from datacentric.planning.plan import Plan
from datacentric.shapes import Bucketing, SampleShape, read_lengths_file


def dataset_shapes(args: argparse.Namespace) -> tuple[list[SampleShape], int]:
    """Sample shapes of ``--dataset SPEC`` (any source of
    :func:`~datacentric.data.sources.open_dataset`, shaped by the data flags) or of
    ``--lengths FILE``, and how many samples the dataset skipped on request."""
    if getattr(args, "lengths", None):
        return read_lengths_file(args.lengths), 0
    if args.dataset:
        from datacentric.data.sources import data_settings, open_dataset, skipped_samples

        settings = args.settings
        dataset = open_dataset(args.dataset, data_settings(settings.data, settings.job.seed))
        return dataset.shapes(), skipped_samples(dataset)
    raise ValueError("give --dataset NAME or --lengths FILE")


def plan_json(
    plan: Plan, bucketing: Bucketing | None = None, cost: Any = None
) -> list[dict[str, Any]]:
    """Bucket rows for JSON output: each bucket's preferred option
    (:meth:`~datacentric.planning.plan.Plan.preferred`), with sample counts when the
    bucketing is known and its memory per rank (``est_memory_bytes``) on ``cost``."""
    counts = {}
    if bucketing is not None:
        counts = {b.name: len(m) for b, m in zip(bucketing.buckets, bucketing.members())}
    rows = []
    for bp in plan.buckets.values():
        row = plan.bucket_row(bp.bucket, cost, with_options=False)
        best = plan.preferred(bp.bucket)
        row["max_batch"] = max(o.max_batch for o in bp.options if o.sp_size == best.sp_size)
        row["options"] = len(bp.options)
        if counts:
            row["samples"] = counts.get(bp.bucket, 0)
        rows.append(row)
    return rows


def format_table(plan: Plan, bucketing: Bucketing | None = None, cost: Any = None) -> str:
    """A fixed-width table of the plan (memory per rank on ``cost``)."""
    rows = plan_json(plan, bucketing, cost)
    header = f"{'bucket':<16}{'shape':>16}{'samples':>9}{'sp':>4}{'ring':>5}{'batch':>7}"
    header += f"{'recomp':>8}{'time s':>11}{'mem GiB':>9}{'options':>9}{'samples/GPU-s':>15}"
    lines = [header]
    for row in rows:
        shape = row["shape"] if isinstance(row["shape"], int) else "x".join(map(str, row["shape"]))
        lines.append(
            f"{row['bucket']:<16}{shape!s:>16}{row.get('samples', ''):>9}{row['sp_size']:>4}"
            f"{row.get('ring', 1):>5}{row['micro_batch_size']:>7}"
            f"{row['num_recomputed']:>5}/{plan.num_blocks:<2}"
            f"{row['est_time_s']:>11.4g}{row.get('est_memory_bytes', float('nan')) / GIB:>9.3f}"
            f"{row['options']:>9}"
            f"{row['samples_per_gpu_second']:>15.4g}"
        )
    lines.append(f"memory cap {plan.memory_cap_bytes} bytes, world {plan.world_size}")
    for name, count in plan.skipped.items():
        lines.append(f"skipped bucket {name}: {count} samples (fits no configuration)")
    return "\n".join(lines)


def add_cost_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The memory budget and the sharding of the commands that build an analytic cost
    model (see :func:`analytic_model`)."""
    add_memory_flags(parser)
    add_shard_flags(parser)


def sharding_of(args: argparse.Namespace) -> Any:
    """The :class:`~datacentric.planning.sharding.ShardingSpec` of ``--shard`` flags."""
    from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec

    return ShardingSpec(args.shard or DEFAULT_SHARD, bool(args.reshard_after_forward))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the per-bucket plan of a profile or of an analytic preset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_option(parser, "--profile", key="profile_dir")
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
    elif not (args.model and args.hardware and has_data and args.world):
        raise ValueError(
            "give --profile-dir DIR, or --model PRESET --hardware PRESET --world N with "
            "--dataset NAME or --lengths FILE"
        )
    else:
        cost, world = analytic_model(args.model, args.hardware, args.world, args), args.world
        source = f"analytic {args.model} on {args.hardware}"
    from datacentric.settings import ScheduleOptions

    # the plan schedule and train make: its options bounded by [scheduling]
    # max_micro_batch_size (--max-micro-batch-size)
    options = ScheduleOptions(max_micro_batch_size=args.max_micro_batch)
    shapes = dataset_shapes(args)[0]
    pipeline = command_pipeline(args, shapes, cost, args.world or world, options=options)
    return pipeline.plan, pipeline.bucketing, source, cost


def command_pipeline(
    args: argparse.Namespace, shapes: list[SampleShape], cost: Any, world: int, **settings: Any
) -> Any:
    """The :class:`~datacentric.scheduling.pipeline.Pipeline` of a command's flags: the
    budget of :func:`memory_budget` and ``--skip-unfittable`` when the command has it;
    ``settings``: the rest (``options``, ``seed``, ``policy``)."""
    from datacentric.scheduling.pipeline import Pipeline

    return Pipeline(
        shapes,
        cost,
        world_size=world,
        memory_cap_bytes=memory_budget(args, cost),
        skip_unfittable=bool(getattr(args, "skip_unfittable", False)),
        **settings,
    )


def memory_budget(args: argparse.Namespace, cost: Any) -> int:
    """The budget per rank of a command, resolved once: ``--memory-gb``, else the cap of
    the plan saved in ``--profile DIR``, else ``--memory-fraction`` of the memory of the
    analytic model's hardware."""
    from datacentric.planning.memory_cap import device_memory_of, resolve_memory_cap
    from datacentric.profiling.store import load_plan

    if args.memory_gb is None and getattr(args, "profile", None):
        return load_plan(args.profile).memory_cap_bytes
    return resolve_memory_cap(args.memory_gb, device_memory_of(cost), args.memory_fraction)


def analytic_model(model: str, hardware: str, world: int, args: argparse.Namespace) -> Any:
    """The analytic cost model of ``--model`` (any model string, with its ``--model-arg``
    keyword arguments) on ``--hardware`` (fp32 on ``cpu-local``, bf16 elsewhere) with
    ``--shard``; the budget is :func:`memory_budget`'s."""
    from datacentric.models.source import parse_model_args
    from datacentric.profiling.factory import analytic_cost_model
    from datacentric.profiling.module_specs import named_spec

    spec = named_spec(
        model, parse_model_args(getattr(args, "model_args", None)), lora_of_args(args)
    )
    return analytic_cost_model(spec, hardware, shard=sharding_of(args), world_size=world)


def profiled_model(args: argparse.Namespace) -> tuple[Any, int]:
    """The cost model fitted to ``--profile DIR`` and the world it was measured on
    (the budget is :func:`memory_budget`'s)."""
    from datacentric.profiling.factory import fitted_cost_model
    from datacentric.profiling.store import ProfileError, load_profile

    profile = load_profile(args.profile)
    if profile is None:
        raise ProfileError(f"{args.profile}: no profile.json")
    return fitted_cost_model(profile), int(profile.fingerprint["world_size"])
