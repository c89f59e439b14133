"""One schema gives every flag its name, help, default and choices, in every command.

Builds every sub-command's parser (``datacentric.cli.main.build_parser``) and holds each
option of a settings key to the schema (``datacentric.settings``): its help starts with
the key's doc, its choices are the key's, and its default is the schema's or the one
the command declares in ``settings.command_defaults.COMMAND_DEFAULTS``, shown in the
help. A flag spelled like a key's flag must be that key's; and a flag offered by
several commands has one description in all of them (a command adds only a note).
The checker is run on planted mismatches too, so it is known to fail.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from repo_paths import ROOT

from datacentric.cli.flags import (
    DeprecatedAlias,
    config_option,
    finish_command,
    section_flag,
    short_flag,
)
from datacentric.cli.main import build_parser
from datacentric.settings.command_defaults import (
    COMMAND_DEFAULTS,
    command_default,
    command_override,
)
from datacentric.settings.layout import flat_docs, flat_types
from datacentric.settings.schema import choices_of

KEY_FLAGS = {flag: key for key in flat_docs() for flag in (section_flag(key), short_flag(key))}


def commands() -> dict[str, argparse.ArgumentParser]:
    return dict(build_parser()._subparsers._group_actions[0].choices)


def visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user sees (not positionals, --help or hidden aliases)."""
    return [
        a
        for a in parser._actions
        if a.option_strings
        and a.help != argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction | DeprecatedAlias)
    ]


def same(a: object, b: object) -> bool:
    """Equal, a list read as the tuple the schema holds."""
    norm = [tuple(v) if isinstance(v, list) else v for v in (a, b)]
    return norm[0] == norm[1]


def shown(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple | list) else str(value)


def key_problems(command: str, action: argparse.Action, takes_file: bool) -> list[str]:
    """What is wrong with one option of a settings key in ``command``."""
    key = action.config_key
    where = f"{command} {action.option_strings[0]} ({key})"
    problems = []
    doc = flat_docs()[key]
    if getattr(action, "description", None) != doc or not action.help.startswith(
        doc.replace("%", "%%")
    ):
        problems.append(f"{where}: help {action.help!r} is not the schema's {doc!r}")
    override = command_override(command, key)
    required = getattr(action, "config_required", False)
    expected = None if required else command_default(command, key)
    if hasattr(action, "config_default"):  # settled after --config, or at parse time
        actual = action.config_default
        parsed_expected = None if takes_file else expected
    else:  # train's and config's flags: unset, so the file's value, then the schema's
        actual = expected if override is None else f"{override.value!r} (an override)"
        parsed_expected = None
    if not same(actual, expected) or not same(action.default, parsed_expected):
        problems.append(
            f"{where}: default {actual!r} (parsed {action.default!r}), expected {expected!r}"
        )
    text = action.help % {**vars(action), "prog": command}
    if override is not None and override.shown:
        if override.shown not in text:
            problems.append(f"{where}: help does not show the default {override.shown!r}")
    elif expected not in (None, False, ()) and shown(expected) not in text:
        problems.append(f"{where}: help {text!r} does not show the default {expected!r}")
    choices = choices_of(flat_types()[key])
    if getattr(action, "config_list", False):  # a comma-separated list of choices
        missing = [c for c in choices or () if str(c) not in text]
        if missing:
            problems.append(f"{where}: help does not name the choices {missing}")
    elif not isinstance(action, argparse.BooleanOptionalAction) and not same(
        action.choices and tuple(action.choices), choices
    ):
        problems.append(f"{where}: choices {action.choices!r}, the schema's {choices!r}")
    return problems


def command_problems(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """Every option of a settings key in ``command`` checked against the schema (and the
    command's declared defaults); a flag spelled as a key's must be that key's."""
    takes_file = parser.get_default("config_options") is not None
    problems = []
    for action in visible(parser):
        key = getattr(action, "config_key", None)
        if key is not None:
            problems += key_problems(command, action, takes_file)
            continue
        for flag in action.option_strings:
            if flag in KEY_FLAGS:
                key = KEY_FLAGS[flag]
                problems.append(f"{command} {flag}: made by hand, not from the schema's {key}")
    return problems


def help_problems(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Flags that two commands describe differently: a flag's description is its help
    without the note its command adds and the default and choices shown after it."""
    seen: dict[str, dict[str, str]] = {}
    for command, parser in parsers.items():
        for action in visible(parser):
            description = getattr(action, "description", action.help)
            for flag in action.option_strings:
                seen.setdefault(flag, {})[command] = description
    return [
        f"{flag}: described differently by {sorted(by)}: {sorted(set(by.values()))}"
        for flag, by in seen.items()
        if len(set(by.values())) > 1
    ]


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_option_of_a_settings_key_is_the_schema_s(command):
    assert command_problems(command, commands()[command]) == []


def test_no_two_commands_describe_a_flag_differently():
    assert help_problems(commands()) == []


def test_every_declared_default_is_a_command_s_flag_or_setting():
    parsers = commands()
    for command, overrides in COMMAND_DEFAULTS.items():
        assert command in parsers, command
        for key, override in overrides.items():
            assert key in flat_docs() and override.reason, (command, key)


def planted(command: str, **flag: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"datacentric {command}")
    config_option(parser, "--seed", key="seed", type=int)
    config_option(parser, key="long_docs")
    if flag:
        parser.add_argument("--planted", **flag)
    finish_command(command, parser)
    return parser


def test_the_checker_finds_planted_mismatches():
    assert command_problems("plan", planted("plan")) == []
    wrong_default = planted("plan")
    wrong_default._option_string_actions["--seed"].config_default = 7
    assert any("default 7 " in p for p in command_problems("plan", wrong_default))
    wrong_choices = planted("plan")
    wrong_choices._option_string_actions["--long-docs"].choices = ("chunk",)
    assert any("choices" in p for p in command_problems("plan", wrong_choices))
    wrong_help = planted("plan")
    wrong_help._option_string_actions["--seed"].description = "a seed"
    assert any("is not the schema's" in p for p in command_problems("plan", wrong_help))
    unshown = planted("bench")
    config_option(unshown, key="memory_gb")
    finish_command("bench", unshown)  # bench's own 0.2, shown in the help
    assert command_problems("bench", unshown) == []
    unshown._option_string_actions["--memory-gb"].help = "Memory cap per rank in GiB"
    assert any("does not show the default 0.2" in p for p in command_problems("bench", unshown))
    by_hand = argparse.ArgumentParser(prog="datacentric plan")
    by_hand.add_argument("--repeats", type=int, default=4, help="passes")
    finish_command("plan", by_hand)
    assert any("made by hand" in p for p in command_problems("plan", by_hand))
    profile = planted("profile")
    config_option(profile, "--repeats", key="repeats", type=int)  # added after: no override
    assert any("default 3 " in p for p in command_problems("profile", profile))
    one, two = planted("a", help="planted flag"), planted("b", help="another help")
    assert help_problems({"a": one, "b": two}) == [
        "--planted: described differently by ['a', 'b']: ['another help', 'planted flag']"
    ]


def test_help_imports_no_torch():
    code = (
        "import sys\nfrom datacentric.cli.main import build_parser\nbuild_parser()\n"
        "assert 'torch' not in sys.modules, 'datacentric --help imports torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
