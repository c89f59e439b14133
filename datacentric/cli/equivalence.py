"""``datacentric equivalence``: one data-centric optimizer step equals one single-process step.

Starts ``--world`` gloo ranks on this machine, runs one iteration that mixes SP
sizes, accumulation counts and recomputation through the data-centric runtime,
runs the same global batch in one process, and compares losses and every
parameter gradient. Exits 1 when ``max_rel_grad_err`` exceeds the tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys

from datacentric.cli.flag_groups import (
    add_json_flag,
    add_model_flags,
    add_timeout_flag,
    add_world_flag,
    lora_of_args,
)
from datacentric.cli.flags import config_option
from datacentric.cli.ranks import announce, refuse_under_torchrun
from datacentric.progress import counted
from datacentric.settings import SHARD_MODES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "equivalence",
        help="check that a mixed-SP, mixed-accumulation step equals a single-process step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flags(parser, note="here a factory may return (model, dataset)")
    add_world_flag(parser, note="gloo ranks")
    config_option(parser, "--seed", key="seed", type=int, note="here: weights, data and samples")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="largest accepted max_rel_grad_err (default: the float32 tolerance of "
        "datacentric.verify.equivalence.TOLERANCE)",
    )
    parser.add_argument(
        "--wrapper",
        choices=SHARD_MODES,
        default="none",
        help="hold the model as is (one all-reduce per step), in DDP, or sharded with FSDP2",
    )
    parser.add_argument(
        "--phased",
        action="store_true",
        help="a step in two phases: the group layout changes once, to one group per rank",
    )
    parser.add_argument(
        "--sp-split",
        metavar="U,R",
        default=None,
        help="first run a group of U x R ranks as Ulysses over U inside a ring of R "
        "(e.g. 1,4 ring only, 2,2 hybrid), then the Ulysses layout, in one step",
    )
    add_timeout_flag(parser, note="here: the whole check")
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if refuse_under_torchrun(
        "equivalence",
        "run it without torchrun (datacentric equivalence --world N): it compares its ranks "
        "with one process on this machine",
    ):
        return 2
    if args.world < 1:
        print(
            f"datacentric equivalence: --world must be at least 1, got {args.world}",
            file=sys.stderr,
        )
        return 2
    announce(  # before the ranks start and import torch
        "equivalence",
        f"{args.model} on {counted(args.world, 'rank')}: one mixed step "
        "against one process; starting the ranks, then the check (a minute or two for a "
        "tiny model on 2 CPU cores)",
        json_output=args.json,
    )
    from datacentric.models.model_args import parse_model_args
    from datacentric.verify.equivalence import TOLERANCE, check_equivalence

    try:
        sp_split = parse_sp_split(args.sp_split)
        model_args = parse_model_args(args.model_args)
        lora = lora_of_args(args)
        (report,) = check_equivalence(
            [args.model],
            args.world,
            seed=args.seed,
            tolerance=TOLERANCE if args.tolerance is None else args.tolerance,
            wrapper=args.wrapper,
            timeout_s=args.timeout_s,
            progress=None if args.json else print,
            phased=args.phased,
            sp_split=sp_split,
            model_args=model_args,
            lora=lora,
        )
    except ValueError as error:  # a bad --model names what is wrong in one line
        print(f"datacentric equivalence: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['model']} ({report['wrapper']}) at world {report['world']}"
            + (f", {report['phases']} phases" if report["phases"] > 1 else "")
            + f": SP sizes {report['sp_sizes']} (Ulysses x ring {report['sp_splits']}), "
            "accumulation counts "
            f"{report['accumulation_counts']}, recomputed blocks {report['recomputed_blocks']}"
        )
        print(f"reference: {report['reference']}; dropout {report['dropout']}")
        print(
            f"loss distributed {report['loss_distributed']:.8f} vs reference "
            f"{report['loss_reference']:.8f}"
        )
        print(
            f"max relative gradient error {report['max_rel_grad_err']:.3e} "
            f"({report['worst_parameter']}), tolerance {report['tolerance']:g}, ranks agree: "
            f"{report['ranks_agree']} -> {'PASS' if report['passed'] else 'FAIL'}"
        )
    return 0 if report["passed"] else 1


def parse_sp_split(text: str | None) -> tuple[int, int] | None:
    """``"U,R"`` (``--sp-split``) as ``(U, R)``; ``ValueError`` naming the flag otherwise."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--sp-split {text!r}: give two positive integers U,R, e.g. 2,2")
    return int(parts[0]), int(parts[1])
