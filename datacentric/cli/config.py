"""``datacentric config --show``: print the resolved configuration as TOML."""

from __future__ import annotations

import argparse

from datacentric.cli.flags import add_config_file_flag, add_config_flags, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="print the resolved configuration (file, then flags) as TOML",
        description="Resolve --config FILE and the --section.key flags as `train` would, "
        "check every setting, and print the result as TOML.",
    )
    parser.add_argument(
        "--show", action="store_true", help="print the resolved configuration (the default)"
    )
    add_config_file_flag(parser)
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(config_from_args(args).to_toml(), end="")
    return 0
