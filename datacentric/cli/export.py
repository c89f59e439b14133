"""``datacentric export RUN --out DIR``: the trained model in the format it came in."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a run's trained model in its source format (save_pretrained, safetensors)",
        description="Write the model of a run's newest checkpoint (or --checkpoint) to a "
        "folder: a Hugging Face or diffusers model with save_pretrained (safetensors), any "
        "other model as model.safetensors. FSDP2 shards are gathered into full tensors.",
    )
    parser.add_argument("run_dir", help="the run folder (--out of `datacentric train`)")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty)")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint of the run to export (step number or folder name; default: newest)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier export in --out"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the model to export into (default: the one the checkpoint records); a "
        "pkg.module:factory run only when named here",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="a model argument, repeatable (replaces the recorded ones)",
    )
    parser.add_argument(
        "--expect-sha256",
        metavar="HEX",
        default=None,
        help="export the checkpoint only if its manifest.json has this SHA-256 (checked first)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: fold the adapters into the model and export it whole (default: "
        "the adapters alone, as a PEFT adapter folder or diffusers LoRA weights)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.train.export import export_run

    summary = export_run(
        args.run_dir,
        args.out,
        checkpoint=args.checkpoint,
        overwrite=args.overwrite,
        model=args.model,
        model_args=args.model_arg,
        expect_sha256=args.expect_sha256,
        merge=args.merge,
    )
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:>16}: {value}")
    return 0
