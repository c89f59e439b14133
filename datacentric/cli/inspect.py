"""``datacentric inspect RUN_DIR``: facts of a run's latest checkpoint.

Reads no pickle unrestricted (:mod:`datacentric.train.checkpoints.safe_load`); prints the SHA-256 of
the checkpoint's ``manifest.json``, the value ``--expect-sha256`` takes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datacentric.cli.flag_groups import add_json_flag
from datacentric.cli.flags import config_option
from datacentric.regular_files import json_field


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect", help="show iterations done, samples seen and weights hash of a run"
    )
    parser.add_argument("run_dir", help="the run folder (--out of `datacentric train`)")
    add_json_flag(parser)
    config_option(parser, key="expect_sha256", metavar="HEX")
    parser.set_defaults(func=run)


def inspect_run(run_dir: str, expect_sha256: str | None = None) -> dict:
    """The latest checkpoint's position, SHA-256 of its model tensors and of its
    manifest (``expect_sha256``: refuse a checkpoint whose manifest has another)."""
    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.checkpoint_load import read_model_state, weights_sha256
    from datacentric.train.checkpoints.checkpoint_verify import (
        latest_checkpoint,
        manifest_sha256,
        verify_checkpoint,
    )

    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    path = latest_checkpoint(run_dir, expect_sha256)
    if path is None:
        raise CheckpointError(f"{run_dir}: no checkpoint found (was the run started with --out?)")
    position = checkpoint_position(verify_checkpoint(path, expect_sha256), path)
    state = read_model_state(path)
    return {
        "checkpoint": path.name,
        "manifest_sha256": manifest_sha256(path),
        **position,
        "weights_sha256": weights_sha256(state),
    }


def checkpoint_position(trainer: dict, path: Path) -> dict[str, int]:
    """Iterations done, samples seen, epoch and world size of a checkpoint's
    ``trainer.json`` (read as ``trainer``); a key missing or not an integer is one line
    naming the file and the key."""
    from datacentric.train.checkpoints.checkpoint_folders import TRAINER_FILE, CheckpointError

    return {
        key: json_field(trainer, key, int, path / TRAINER_FILE, error=CheckpointError)
        for key in ("iterations_done", "samples_seen", "epoch", "world_size")
    }


def run(args: argparse.Namespace) -> int:
    info = inspect_run(args.run_dir, args.expect_sha256)
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:>16}: {value}")
    return 0
