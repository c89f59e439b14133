"""The ``datacentric`` command: one sub-command per module of this package.

Each module in ``datacentric.cli`` that defines ``register(subparsers)`` adds its
sub-command; ``register`` must set ``func`` (taking the parsed args, returning an
exit code) as the parser default.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import datacentric.cli as cli_package


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datacentric",
        description="Data-Centric Parallel training for variable-length sequences.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "main":
            continue
        module = importlib.import_module(f"datacentric.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
