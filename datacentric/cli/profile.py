"""``datacentric profile``: dual-layer profile, plan and validation of a model on a dataset.

Starts ``--world`` local ranks (gloo on CPU, or NCCL with ``--backend nccl``), measures
dual-layer profile points of a few bucket shapes per SP size through the real runtime,
fits the cost model, plans every bucket under ``--memory-gb`` and checks the
extrapolation on ``--validate`` buckets by running the full-depth model. Writes
``profile.json`` and ``plan.json`` to ``--profile-dir``; a fresh profile found there is reused
(``--overwrite`` re-measures), a stale one (other model, device, torch, world or dtype) is
re-measured, a corrupt one is an error. Settings may come from ``--config FILE`` (the
keys of its flags; flags override it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from datacentric.cli.flag_groups import (
    add_dataset_flags,
    add_json_flag,
    add_memory_flags,
    add_model_flags,
    add_skip_unfittable_flag,
    add_timeout_flag,
    add_world_flag,
    check_out_folder,
    lora_of_args,
)
from datacentric.cli.flags import config_option, enable_config_file
from datacentric.cli.plan_table import TABLE_KEY, format_table, plan_json
from datacentric.cli.planning_inputs import data_named, dataset_shapes
from datacentric.cli.ranks import announce, refuse_under_torchrun
from datacentric.progress import counted
from datacentric.settings.command_defaults import CPU_MAX_TOKENS, GPU_MAX_TOKENS

#: Bucket shapes profiled, and buckets validated, by default.
MAX_POINTS = VALIDATE = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="profile a model on this machine and plan a dataset's buckets",
        description=__doc__,
        epilog=TABLE_KEY,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flags(parser)
    add_dataset_flags(parser)
    add_world_flag(parser)
    add_memory_flags(parser, fraction=False, required=True)
    config_option(
        parser,
        "--out",
        key="profile_dir",
        metavar="DIR",
        note="it holds profile.json and plan.json",
    )
    parser.add_argument(
        "--backend", default="gloo", choices=("gloo", "nccl"), help="collective backend"
    )
    config_option(parser, "--dtype", key="dtype")
    config_option(parser, "--warmup", key="warmup", type=int)
    config_option(parser, "--repeats", key="repeats", type=int)
    parser.add_argument(
        "--max-points", type=int, default=MAX_POINTS, help="bucket shapes to profile"
    )
    parser.add_argument(
        "--max-profile-tokens",
        type=int,
        help=f"largest profiled sample (default: {CPU_MAX_TOKENS} with gloo, {GPU_MAX_TOKENS} "
        "with nccl)",
    )
    parser.add_argument(
        "--validate", type=int, default=VALIDATE, help="buckets to validate (0: no)"
    )
    parser.add_argument(
        "--validation-tokens",
        type=int,
        help=f"largest validated micro-batch (default: {CPU_MAX_TOKENS} with gloo, "
        f"{GPU_MAX_TOKENS} with nccl)",
    )
    add_skip_unfittable_flag(parser)
    config_option(
        parser,
        "--force",
        key="overwrite",
        dest="overwrite",
        action=argparse.BooleanOptionalAction,
        note="here: re-measure the profile in --profile-dir even when it is fresh",
    )
    add_timeout_flag(parser, note="here: each launch of the ranks")
    add_json_flag(parser)
    enable_config_file(parser)
    parser.set_defaults(func=run)


#: How to profile when under torchrun: the command starts its own ranks, once per SP size.
UNDER_TORCHRUN_FIX = (
    "run it without torchrun (datacentric profile --world N), or let datacentric train "
    "under torchrun measure its profile on torchrun's ranks (cost.cost_model profile, "
    "the default)"
)


def _profile_dir(args: argparse.Namespace) -> str:
    """``--profile-dir``, or its default for the model and world; a file is refused."""
    default = f"runs/profile-{model_folder_name(args.model)}-world{args.world}"
    return check_out_folder(args.out or default, "--profile-dir")


def model_folder_name(model: str) -> str:
    """``model`` as one folder name: a preset's name as it is, a model folder's
    (``hf:DIR``, ``diffusers:DIR``) last name, and any character outside
    ``[A-Za-z0-9._-]`` (a factory's ``:``) replaced by ``_``."""
    kind, colon, target = model.partition(":")
    if colon and kind in ("hf", "diffusers"):
        folder = Path(target).expanduser()
        model = folder.name if folder.name not in ("", ".", "..") else folder.resolve().name
    return re.sub(r"[^A-Za-z0-9._-]", "_", model) or kind


def run(args: argparse.Namespace) -> int:
    if refuse_under_torchrun("profile", UNDER_TORCHRUN_FIX):
        return 2
    args.out = _profile_dir(args)
    announce("profile", _start_line(args), json_output=args.json)  # before torch loads
    from datacentric.models.model_args import parse_model_args
    from datacentric.planning.memory_cap import resolve_memory_cap
    from datacentric.planning.planner import UnfittableBucketError
    from datacentric.profiling.autoprofile import run_profile
    from datacentric.profiling.factory import fitted_cost_model
    from datacentric.profiling.profiler import ProfileSettings
    from datacentric.profiling.store import ProfileError
    from datacentric.settings.sections import CostConfig
    from datacentric.shapes import make_buckets

    start = time.perf_counter()
    longest = CPU_MAX_TOKENS if args.backend == "gloo" else GPU_MAX_TOKENS
    if args.max_tokens is None:
        args.max_tokens = longest
        args.settings = args.settings.updated(data={"max_tokens": longest})
    args.max_profile_tokens = args.max_profile_tokens or longest
    args.validation_tokens = args.validation_tokens or longest
    try:
        shapes = dataset_shapes(args)[0]
        bucketing = make_buckets(shapes)
        settings = ProfileSettings(
            model=args.model,
            model_args=parse_model_args(args.model_args),
            lora=lora_of_args(args),
            world_size=args.world,
            backend=args.backend,
            dtype=args.dtype or ("float32" if args.backend == "gloo" else "bfloat16"),
            cost=CostConfig(
                warmup=max(2, args.warmup), repeats=args.repeats, timeout_s=args.timeout_s
            ),
            progress=not args.json,
        )
        report = run_profile(
            settings,
            shapes,
            memory_cap_bytes=resolve_memory_cap(args.memory_gb, None),
            max_points=args.max_points,
            max_profile_tokens=args.max_profile_tokens,
            validate=args.validate,
            validation_tokens=args.validation_tokens,
            skip_unfittable=args.skip_unfittable,
            out_dir=args.out,
            reuse=not args.overwrite,
        )
    except (ProfileError, UnfittableBucketError, ValueError, KeyError, OSError) as err:
        print(f"datacentric profile: {err}", file=sys.stderr)
        return 2
    profile, plan = report.profile, report.plan
    cost = fitted_cost_model(profile)
    out = {
        "model": args.model,
        "dataset": args.dataset or args.lengths,
        "world": args.world,
        "memory_cap_bytes": plan.memory_cap_bytes,
        "buckets": plan_json(plan, bucketing, cost),
        "skipped": plan.skipped,
        "profile_seconds": profile.profile_seconds,
        "profile_reused": report.reused,
        "wall_seconds": time.perf_counter() - start,
        "validation": profile.validation,
        "out": args.out,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(format_table(plan, bucketing, cost))
    _print_summary(profile, report.reused, args.out)
    return 0


def _print_summary(profile: Any, reused: bool, out: str) -> None:
    """The lines under the plan's table: where the profile went, and its validation."""
    verb = "reused" if reused else "measured"
    print(f"profile {verb} in {profile.profile_seconds:.1f} s; saved to {out}")
    if profile.validation:
        v = profile.validation
        print(
            f"validation on {counted(len(v['buckets']), 'bucket')} (full depth vs dual-layer): "
            f"time_rel_err {v['time_rel_err']:.3f} (spread between "
            f"{v.get('sessions', 1)} sessions {v.get('time_noise_rel', 0.0):.3f}), "
            f"memory_rel_err {v['memory_rel_err']:.3f}"
        )


def _start_line(args: argparse.Namespace) -> str:
    """What ``profile`` will do, said before torch loads and the ranks start (no data
    given: refused first)."""
    return (
        f"{args.model} on {data_named(args)}, "
        f"{counted(args.world, f'{args.backend} rank')}, memory cap {args.memory_gb} GiB, into "
        f"{args.out} (a fresh profile there is reused); starting the ranks, then profiling "
        f"with time left ({_how_long(args)})"
    )


def _how_long(args: argparse.Namespace) -> str:
    """How long a profile takes: measured for the tiny llama at the defaults, else what
    it grows with."""
    tiny = args.model == "llama" and args.backend == "gloo"
    if tiny and args.world == 2 and (args.max_points, args.validate) == (MAX_POINTS, VALIDATE):
        return "the tiny llama at 2 gloo ranks: about half a minute on 2 idle CPU cores"
    return "how long grows with the model's size, --world, --max-points and --validate"
