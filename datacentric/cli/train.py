"""``datacentric train``: train a model under a data-centric schedule.

Under torchrun (``torchrun --nproc-per-node N -m datacentric train ...``) each
rank joins the job from the environment; with ``--nproc N`` the command starts
N local ranks itself (gloo on CPU); otherwise it runs as one process
(``parallel.launch.launch_mode`` decides).
"""

from __future__ import annotations

import argparse
import json

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
        help="start this many local ranks (gloo) instead of using torchrun",
    )
    add_config_flags(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    parser.set_defaults(func=run)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field (unset flags keep the file's value)."""
    for name, field in TrainConfig.__dataclass_fields__.items():
        flag = "--" + name.replace("_", "-")
        if field.type in ("bool",):
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None
            )
        elif name == "betas":
            parser.add_argument(flag, dest=name, type=float, nargs=2, default=None)
        else:
            kind = {"int": int, "float": float}.get(str(field.type).split(" |")[0], str)
            parser.add_argument(flag, dest=name, type=kind, default=None)


def run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in TrainConfig.__dataclass_fields__}
    config = load_config(args.config, **overrides)
    results = launch(
        train_rank, config, nproc=args.nproc, collective_timeout_s=config.collective_timeout_s
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
