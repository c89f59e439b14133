"""One flag vocabulary: every command's flags of a settings key are spelled alike.

Walks every sub-command's parser: a settings key has its section flag
(``--section.key``) and one short alias (the key with dashes) wherever a command takes
it; older spellings are hidden aliases that warn and set the same key; a command that
reads ``--config`` spells no other flag like a key's short alias.
"""

from __future__ import annotations

import argparse

import pytest

from datacentric.cli.flags import DeprecatedAlias, section_flag, short_flag
from datacentric.cli.main import build_parser, main
from datacentric.settings import section_keys

KEYS = [key for keys in section_keys().values() for key in keys]
SHORT = {short_flag(key): key for key in KEYS}


def commands() -> dict[str, argparse.ArgumentParser]:
    return dict(build_parser()._subparsers._group_actions[0].choices)


def takes_config(parser: argparse.ArgumentParser) -> bool:
    return any(a.dest == "config" for a in parser._actions)


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_key_has_one_section_flag_and_one_short_alias(name):
    parser = commands()[name]
    seen: dict[str, list[str]] = {}
    for action in parser._actions:
        key = getattr(action, "config_key", None)
        if key is None:
            continue
        assert key not in seen, f"{name}: two flags for {key}: {seen[key]}, {action.option_strings}"
        plain = [f for f in action.option_strings if not f.startswith("--no-")]
        assert sorted(plain) == sorted([section_flag(key), short_flag(key)]), (name, plain)
        seen[key] = plain
    if not takes_config(parser):
        return
    for action in parser._actions:
        if getattr(action, "config_key", None) or isinstance(action, DeprecatedAlias):
            continue
        for flag in action.option_strings:
            assert flag not in SHORT, f"{name}: {flag} is spelled like key {SHORT[flag]}'s flag"


def sample_value(alias: argparse.Action) -> list[str]:
    """Arguments an alias accepts."""
    if alias.nargs == 0:
        return []
    if alias.choices:
        return [str(next(iter(alias.choices)))]
    name = getattr(alias.type, "__name__", "")
    one = {"int": "7", "float": "7", "policy_list": "static", "int_list": "2"}.get(name, "x")
    return [one] * (alias.nargs if isinstance(alias.nargs, int) else 1)


@pytest.mark.parametrize("name", sorted(commands()))
def test_old_names_are_hidden_aliases_that_warn(name, capsys):
    parser = commands()[name]
    aliases = [a for a in parser._actions if isinstance(a, DeprecatedAlias)]
    for alias in aliases:
        assert alias.help == argparse.SUPPRESS
        flag = alias.option_strings[0]
        new = parser._option_string_actions.get(alias.new)
        assert new is not None and new.dest == alias.dest, (name, flag, alias.new)
        namespace, _ = parser.parse_known_args([flag, *sample_value(alias)])
        assert getattr(namespace, alias.dest) is not None
        assert f"{flag} is deprecated; use {alias.new}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "dest", "value", "old"),
    [
        (["plan", "--profile", "p"], "profile", "p", "--profile"),
        (["schedule", "--profile", "p"], "profile", "p", "--profile"),
        (["profile", "--out", "p"], "out", "p", "--out"),
        (["schedule", "--max-sp", "4"], "max_sp", 4, "--max-sp"),
        (["profile", "--force"], "overwrite", True, "--force"),
        (["simulate", "--num-samples", "5"], "dataset_limit", 5, "--num-samples"),
        (["simulate", "--preset", "stdlib-code"], "dataset", "stdlib-code", "--preset"),
        (["plan", "--max-micro-batch", "8"], "max_micro_batch", 8, "--max-micro-batch"),
        (["train", "--profiling.memory_gb", "2"], "memory_gb", 2.0, "--profiling.memory_gb"),
        (["plan", "--profiling.memory_gb", "2"], "memory_gb", 2.0, "--profiling.memory_gb"),
    ],
)
def test_the_renamed_flags_keep_their_old_names(argv, dest, value, old, capsys):
    assert getattr(build_parser().parse_args(argv), dest) == value
    assert f"{old} is deprecated" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["plan", "--profile-dir", "p"], "profile", "p"),
        (["profile", "--profile-dir", "p"], "out", "p"),
        (["schedule", "--max-sp-size", "4"], "max_sp", 4),
        (["profile", "--overwrite"], "overwrite", True),
        (["simulate", "--dataset-limit", "5"], "dataset_limit", 5),
        (["train", "--log-every", "3"], "log_every", 3),
        (["train", "--metrics.log_every", "3"], "log_every", 3),
        (["train", "--trace-steps", "3,4"], "trace_steps", (3, 4)),
        (["train", "--quiet"], "log_level", "warning"),
        (["train", "--cost.memory_gb", "2"], "memory_gb", 2.0),
    ],
)
def test_the_new_names(argv, dest, value, capsys):
    assert getattr(build_parser().parse_args(argv), dest) == value
    assert "deprecated" not in capsys.readouterr().err


def test_old_cost_section_in_a_file_is_the_same_setting(tmp_path, capsys):
    from datacentric.settings import load_config

    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text("[profiling]\nmemory_gb = 3.0\ncost_model = 'analytic'\ntrace_steps = [2]\n")
    new.write_text(
        "[cost]\nmemory_gb = 3.0\ncost_model = 'analytic'\n[profiling]\ntrace_steps = [2]\n"
    )
    assert load_config(old).to_json() == load_config(new).to_json()
    err = capsys.readouterr().err
    assert "[profiling] memory_gb is deprecated; write it under [cost]" in err
    assert "trace_steps is deprecated" not in err


def test_a_bad_trace_step_list_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--trace-steps", "two"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "comma-separated integers" in err
    assert main(["train", "--trace-steps", "0,2"]) == 2
    assert "profiling.trace_steps: steps are numbered from 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(commands()))
def test_the_help_of_a_key_is_the_schema_doc_in_every_command(name):
    from datacentric.settings.layout import flat_docs

    docs = flat_docs()
    for action in commands()[name]._actions:
        key = getattr(action, "config_key", None)
        if key is not None:
            assert action.help.startswith(docs[key].replace("%", "%%")), (name, key, action.help)


def test_config_option_refuses_a_help_text_of_its_own():
    from datacentric.cli.flags import config_option

    with pytest.raises(TypeError, match="note="):
        config_option(argparse.ArgumentParser(), key="memory_gb", help="cap per rank")
