"""The ``datacentric`` command: one sub-command per module of this package.

Each module in ``datacentric.cli`` that defines ``register(subparsers)`` adds its
sub-command; ``register`` must set ``func`` (taking the parsed args, returning an
exit code) as the parser default.

:func:`main` is the one place that reports a failure: one line
``datacentric <command>: <message>`` on stderr and exit status 2. ``--debug`` (or
``DATACENTRIC_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import pkgutil
import sys
import typing
from collections.abc import Sequence

import datacentric
import datacentric.cli as cli_package
from datacentric.cli.flags import apply_config_file, finish_command
from datacentric.cli.ranks import first_to_say, say
from datacentric.log import VERBOSE_ENV, quiet_third_party
from datacentric.settings.trainer_fields import equivalent, other_names


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line (``datacentric <command>: ...``), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        line = f"{self.prog}: {message} (see {self.prog} --help)"
        self.exit(2, line + "\n" if first_to_say(line) else None)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="datacentric",
        description="Data-Centric Parallel training for variable-length sequences.",
    )
    parser.add_argument(
        "--version", action="version", version=f"datacentric {datacentric.__version__}"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of a failure (also: DATACENTRIC_DEBUG=1); accepted anywhere",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="let other libraries' progress bars, advice and profiler lines through "
        "(also: DATACENTRIC_VERBOSE=1); accepted anywhere",
    )
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=OneLineParser
    )
    for info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "main":
            continue
        module = importlib.import_module(f"datacentric.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    for name, sub in subparsers.choices.items():
        finish_command(name, sub)
    return parser


#: Other trainers' names (:func:`~datacentric.settings.trainer_fields.other_names`) as
#: flags, to our setting's short flag (``--learning-rate`` -> ``--lr``).
OTHER_FLAGS = {
    "--" + other.replace("_", "-"): "--" + ours.partition(".")[2].replace("_", "-")
    for other, ours in other_names().items()
}


def closest_flag(flag: str, valid: Sequence[str]) -> str | None:
    """The flag of ``valid`` a mistyped ``flag`` most likely means: the closest spelling
    (underscores read as dashes), also among other trainers' names (:data:`OTHER_FLAGS`)
    whose flag of ours the command has; None when nothing is close."""
    known = set(valid)
    aliases = {other: ours for other, ours in OTHER_FLAGS.items() if ours in known}
    spellings = {flag, flag.replace("_", "-")}

    def likeness(candidate: str) -> float:
        return max(difflib.SequenceMatcher(None, s, candidate).ratio() for s in spellings)

    best = max([*valid, *aliases], key=likeness, default=None)
    if best is None or likeness(best) < 0.6:
        return None
    return aliases.get(best, best)


def foreign_flag(flag: str, actions: dict[str, argparse.Action]) -> str | None:
    """`` (did you mean --ours? ...)`` for a transformers, TRL or torchtitan name whose
    equivalent setting (:func:`~datacentric.settings.trainer_fields.equivalent`) is a
    flag of the command (its short spelling), else None."""
    found = equivalent(flag.split("=")[0])
    if found is None:
        return None
    setting, what = found
    action = actions.get("--" + setting)
    if action is None or action.help == argparse.SUPPRESS:
        return None
    return f" (did you mean {action.option_strings[-1]}? {what})"


def one_line(err: BaseException) -> str:
    """A failure as one line: the message's first line (a rank's failure carries
    its traceback on the following lines), prefixed by the type for internal errors.
    A spawned rank's refusal of bad input is the line one process says, followed by the
    ranks it came from where not every rank refused so and the line does not begin with
    its rank already (``(on rank 1 of 2)``)."""
    rank_error = _rank_refusal(err)
    if rank_error is not None:
        line, where = one_line(rank_error), err.where  # type: ignore[attr-defined]
        named = len(err.ranks) == 1 and line.startswith(f"rank {err.rank}:")  # type: ignore[attr-defined]
        return line + (f" ({where})" if where and not named else "")
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if _user_error(err):
        if isinstance(err, FileNotFoundError | PermissionError) and err.filename:
            return f"{err.filename}: {err.strerror}"
        return text or type(err).__name__
    return f"internal error {type(err).__name__}: {text} (rerun with --debug for the traceback)"


def _user_error(err: BaseException) -> bool:
    """Whether ``err`` is a refusal of bad input (said in one line as it is), not a crash."""
    return isinstance(err, ValueError | OSError | RuntimeError | LookupError)


def _rank_refusal(err: BaseException) -> BaseException | None:
    """The refusal a spawned rank raised, where ``err`` is its failure
    (:class:`~datacentric.parallel.launch.RankFailure`) and the rank's own exception a
    refusal; None otherwise: a crash in a rank, or a collective that failed with a peer
    (``torch.distributed.DistError``), keeps its ``rank R failed: Type:`` line."""
    launch = sys.modules.get("datacentric.parallel.launch")  # imported where ranks ran
    if launch is None or not isinstance(err, launch.RankFailure):
        return None
    import torch.distributed  # loaded already, with the launcher

    error = err.error
    if error is None or isinstance(error, torch.distributed.DistError):
        return None
    return error if _user_error(error) else None


def run_command(args: argparse.Namespace) -> int:
    """Settle the ``--config`` file's values (commands other than ``train``), then run."""
    apply_config_file(args)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("DATACENTRIC_DEBUG", "") not in ("", "0")
    if "--debug" in argv:
        argv.remove("--debug")
        debug = True
    if "--verbose" in argv:  # accepted anywhere, as --debug: other libraries' output too
        argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"
    quiet_third_party()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = getattr(args, "command", None)
        sub = parser._subparsers._group_actions[0].choices.get(command) if command else None
        shown = sub._option_string_actions.items() if sub else ()
        valid = [flag for flag, action in shown if action.help != argparse.SUPPRESS]
        flag = next((e for e in extra if e.startswith("-")), extra[0])
        close = closest_flag(flag.split("=")[0], valid)
        hint = foreign_flag(flag, dict(shown)) or (f" (did you mean {close}?)" if close else "")
        say(command, f"unrecognized arguments: {' '.join(extra)}{hint}")
        return 2
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    if debug:
        return run_command(args)
    try:
        return run_command(args)
    except KeyboardInterrupt:
        say(args.command, "interrupted")
        return 130
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - the one place a failure is reported
        say(args.command, one_line(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
