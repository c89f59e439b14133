"""``datacentric models``: the support table of every model class installed."""

from __future__ import annotations

import argparse
import json

from datacentric.cli.flag_groups import add_json_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="which installed transformers / diffusers classes train exactly, and why not",
        description="List every transformers causal LM and every diffusers "
        "*Transformer2DModel/*Transformer3DModel installed: exact (with the tests that "
        "show it), refused (with the pre-check's reason) or untested.",
    )
    add_json_flag(parser, note="here: the table, on one line")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.verify.support import support_table

    table = support_table()
    if args.json:
        print(json.dumps(table, separators=(",", ":")))
        return 0
    for library, rows in table.items():
        print(f"{library}: {len(rows)} classes")
        for row in rows:
            print(f"  {row['status']:<8} {row['class']}: {row['reason']}")
    return 0
