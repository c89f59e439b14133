"""The command-line flag set against its checked-in snapshot, tests/cli_flags.txt.

Every visible flag of every command (its spellings, one line per flag; hidden
deprecated aliases and ``--help`` left out) is listed in the snapshot. Adding,
removing or respelling a flag fails :func:`test_the_flag_set_matches_the_snapshot` until
the snapshot is regenerated in the same change, so that the change is reviewed as a
change of the command line (with its CHANGELOG line, and a deprecated alias for a
removed or renamed flag)::

    .venv/bin/python tests/runtime/cli/test_flag_snapshot.py --update
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[2] / "cli_flags.txt"
UPDATE = ".venv/bin/python tests/runtime/cli/test_flag_snapshot.py --update"
HEADER = (
    "# Every visible flag of every `datacentric` command, one line per flag: COMMAND FLAGS.\n"
    f"# Regenerate after an intended change: {UPDATE}\n"
)


def visible_flags(parser: argparse.ArgumentParser) -> list[str]:
    """One entry per visible option of ``parser``: its spellings, comma-separated
    (not ``--help``, not a hidden deprecated alias)."""
    return [
        ", ".join(sorted(action.option_strings))
        for action in parser._actions
        if action.option_strings
        and action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction)
    ]


def flag_lines(commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    """``COMMAND FLAGS`` for every visible flag of every command, sorted."""
    return sorted(f"{name} {flags}" for name, p in commands.items() for flags in visible_flags(p))


def live_lines() -> list[str]:
    """The lines of the command line as built now."""
    from datacentric.cli.main import build_parser

    return flag_lines(dict(build_parser()._subparsers._group_actions[0].choices))


def read_snapshot(path: Path = SNAPSHOT) -> list[str]:
    """The snapshot's lines (comments and blank lines left out)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def failure_message(snapshot: list[str], live: list[str]) -> str:
    """What differs, and how to make the change a reviewed one."""
    added = sorted(set(live) - set(snapshot))
    removed = sorted(set(snapshot) - set(live))
    lines = [f"+ {line}" for line in added] + [f"- {line}" for line in removed]
    return (
        "the command-line flags differ from tests/cli_flags.txt (+ new, - gone):\n"
        + "\n".join(lines)
        + f"\nIf the change is intended, regenerate the snapshot with `{UPDATE}` and commit "
        "tests/cli_flags.txt in the same change, with a CHANGELOG line (a removed or renamed "
        "flag keeps its old name as a hidden, warning alias: cli/flags.add_deprecated_alias)."
    )


def test_the_flag_set_matches_the_snapshot() -> None:
    snapshot, live = read_snapshot(), live_lines()
    assert snapshot == live, failure_message(snapshot, live)


def test_an_added_or_removed_flag_fails_against_the_snapshot(tmp_path: Path) -> None:
    """A planted change of one command: a new flag, a dropped spelling."""
    parser = argparse.ArgumentParser(prog="planted")
    parser.add_argument("--world", "--world.n", type=int)
    parser.add_argument("--old", help=argparse.SUPPRESS)  # hidden: not listed
    snapshot = tmp_path / "cli_flags.txt"
    snapshot.write_text(HEADER + "\n".join(flag_lines({"planted": parser})) + "\n")
    assert read_snapshot(snapshot) == ["planted --world, --world.n"]
    changed = argparse.ArgumentParser(prog="planted")
    changed.add_argument("--world", type=int)
    changed.add_argument("--seed", type=int)
    live = flag_lines({"planted": changed})
    assert read_snapshot(snapshot) != live
    message = failure_message(read_snapshot(snapshot), live)
    assert "+ planted --seed" in message and "+ planted --world\n" in message
    assert "- planted --world, --world.n" in message and UPDATE in message


def update() -> int:
    """Rewrite the snapshot from the command line as built now."""
    live = live_lines()
    SNAPSHOT.write_text(HEADER + "\n".join(live) + "\n", encoding="utf-8")
    commands = len({line.split(" ", 1)[0] for line in live})
    print(f"wrote {len(live)} flags of {commands} commands to tests/cli_flags.txt")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    sys.exit(update())
