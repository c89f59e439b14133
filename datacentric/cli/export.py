"""``datacentric export RUN --out DIR``: the trained model in the format it came in."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datacentric.cli.flag_groups import add_json_flag, add_model_flags, add_out_flag
from datacentric.cli.flags import config_option
from datacentric.cli.ranks import announce


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a run's trained model in its source format (save_pretrained, safetensors)",
        description="Write the model of a run's newest checkpoint (or --checkpoint) to a "
        "folder: a Hugging Face or diffusers model with save_pretrained (safetensors), any "
        "other model as model.safetensors. FSDP2 shards are gathered into full tensors.",
    )
    parser.add_argument("run_dir", help="the run folder (--out of `datacentric train`)")
    add_out_flag(parser, required=True, note="here: the exported model, a new or empty folder")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint of the run to export (step number or folder name; default: newest)",
    )
    config_option(
        parser, key="overwrite", action="store_true", note="here: an earlier export in --out"
    )
    add_model_flags(
        parser,
        lora=False,
        note="here: the model to export into, with --model-arg replacing the recorded "
        "arguments; a pkg.module:factory runs only when named here",
    )
    config_option(parser, key="expect_sha256", metavar="HEX")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: fold the adapters into the model and export it whole (default: "
        "the adapters alone, as a PEFT adapter folder or diffusers LoRA weights)",
    )
    parser.add_argument(
        "--weights-dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="write the weights cast to this dtype (a Hugging Face config.json says it too) "
        "[default: as the checkpoint holds them: a run trains float32 master weights, "
        "whatever the model folder's dtype]",
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.train.exporting.export_folders import check_export

    run_dir, out = Path(args.run_dir), Path(args.out)
    found = check_export(  # a wrong folder is one line, before the first
        run_dir,
        out,
        checkpoint=args.checkpoint,
        overwrite=args.overwrite,
        expect_sha256=args.expect_sha256,
    )
    announce(  # before torch loads
        "export",
        f"{found.name} of {run_dir} into {out}; loading torch first (seconds), then "
        "checking the checkpoint's files, building the model and writing it (how long "
        "grows with the model's size)",
        json_output=args.json,
    )
    from datacentric.train.exporting.export import export_run

    summary = export_run(
        args.run_dir,
        args.out,
        checkpoint=args.checkpoint,
        overwrite=args.overwrite,
        model=args.model,
        model_args=args.model_args,
        expect_sha256=args.expect_sha256,
        merge=args.merge,
        dtype=args.weights_dtype,
    )
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:>16}: {value}")
    return 0
