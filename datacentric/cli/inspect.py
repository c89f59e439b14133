"""``datacentric inspect RUN_DIR``: facts of a run's latest checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect", help="show iterations done, samples seen and weights hash of a run"
    )
    parser.add_argument("run_dir", help="the run folder (--out of `datacentric train`)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def inspect_run(run_dir: str) -> dict:
    """The latest checkpoint's position and SHA-256 of its model tensors."""
    from datacentric.train.checkpoint import (
        CheckpointError,
        latest_checkpoint,
        read_model_state,
        verify_checkpoint,
        weights_sha256,
    )

    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    path = latest_checkpoint(run_dir)
    if path is None:
        raise CheckpointError(f"{run_dir}: no checkpoint found (was the run started with --out?)")
    trainer = verify_checkpoint(path)
    state = read_model_state(path)
    return {
        "checkpoint": path.name,
        "iterations_done": trainer["iterations_done"],
        "samples_seen": trainer["samples_seen"],
        "epoch": trainer["epoch"],
        "world_size": trainer["world_size"],
        "weights_sha256": weights_sha256(state),
    }


def run(args: argparse.Namespace) -> int:
    info = inspect_run(args.run_dir)
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:>16}: {value}")
    return 0
