"""``datacentric train``: train a model under a data-centric schedule.

Under torchrun (``torchrun --nproc-per-node N -m datacentric train ...``) each
rank joins the job from the environment; with ``--nproc N`` the command starts
N local ranks itself (gloo on CPU); otherwise it runs as one process
(``parallel.launch.launch_mode`` decides).
"""

from __future__ import annotations

import argparse
import json
import sys

from datacentric.cli.plan import DATASET_HELP, add_data_arguments
from datacentric.parallel.launch import launch
from datacentric.train.config import TrainConfig, load_config
from datacentric.train.trainer import train_rank


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model with a data-centric schedule")
    parser.add_argument("--config", help="TOML file of settings ([train] table or top level)")
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="start this many local ranks instead of using torchrun (NCCL with one GPU "
        "each when there are enough GPUs, else gloo)",
    )
    add_config_flags(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    parser.set_defaults(func=run)


#: Fields whose flags (with help) come from :func:`add_data_arguments`.
DATA_FLAGS = ("max_tokens", "tokenizer", "text_field", "long_docs", "bucket_config")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field (unset flags keep the file's value)."""
    add_data_arguments(parser, TrainConfig.max_tokens)
    for name, field in TrainConfig.__dataclass_fields__.items():
        flag = "--" + name.replace("_", "-")
        if name in DATA_FLAGS:
            continue
        if name == "dataset":
            parser.add_argument(flag, dest=name, default=None, help=DATASET_HELP)
        elif field.type in ("bool",):
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None
            )
        elif name == "betas":
            parser.add_argument(flag, dest=name, type=float, nargs=2, default=None)
        else:
            kind = {"int": int, "float": float}.get(str(field.type).split(" |")[0], str)
            parser.add_argument(flag, dest=name, type=kind, default=None)


def check_dataset(config: TrainConfig, command: str) -> bool:
    """Open the run's dataset once up front: bad data is one line on stderr (False),
    and samples skipped on request are reported there."""
    from datacentric.data.base import DataError
    from datacentric.data.sources import skipped_samples
    from datacentric.train.build import build_dataset

    try:
        dataset = build_dataset(config)
    except (DataError, OSError) as err:
        print(f"datacentric {command}: {err}", file=sys.stderr)
        return False
    skipped = skipped_samples(dataset)
    if skipped:
        print(f"datacentric {command}: {skipped} samples skipped as asked", file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in TrainConfig.__dataclass_fields__}
    config = load_config(args.config, **overrides)
    if not check_dataset(config, "train"):
        return 2
    results = launch(
        train_rank,
        config,
        nproc=args.nproc,
        collective_timeout_s=config.collective_timeout_s,
        device=config.device,
    )
    if 0 in results:
        result = results[0]
        summary = {
            "iterations_done": result.iterations_done,
            "samples_seen": result.samples_seen,
            "first_loss": result.losses[0] if result.losses else None,
            "final_loss": result.losses[-1] if result.losses else None,
            "mean_tokens_per_s": (
                sum(result.tokens_per_s) / len(result.tokens_per_s) if result.tokens_per_s else None
            ),
            "weights_sha256": result.weights_sha256,
            "out": result.out_dir,
        }
        print(
            json.dumps(summary)
            if args.json
            else "\n".join(f"{k:>18}: {v}" for k, v in summary.items())
        )
    return 0
