"""The command line's one vocabulary: help on every flag, deprecated aliases, ``--config``
for the commands other than ``train``, the shipped example configs and the README's
command lines."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
from repo_paths import ROOT

from datacentric.cli.flags import apply_config_file, shown_default
from datacentric.cli.main import build_parser, main
from datacentric.models.presets import MODEL_PRESETS
from datacentric.settings import load_config

EXAMPLES = sorted((ROOT / "examples" / "configs").glob("*.toml"))


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return dict(build_parser()._subparsers._group_actions[0].choices)


def test_every_option_of_every_command_shows_help_default_and_choices():
    commands = subcommands()
    assert {"train", "profile", "plan", "schedule", "simulate", "bench", "demo"} <= set(commands)
    assert {"equivalence", "inspect", "calibrate", "config"} <= set(commands)
    for name, parser in commands.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help.strip(), f"{where}: no help"
            text = action.help % {**vars(action), "prog": parser.prog}
            default = shown_default(action)
            if default is not None:
                assert str(default) in text, f"{where}: default {default!r} not in {text!r}"
            for choice in action.choices or ():
                assert str(choice) in text, f"{where}: choice {choice!r} not in help"


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "dest", "value", "note"),
    [
        (["simulate", "--preset", "stdlib-code", "--gpus", "4"], "world", 4, "--gpus"),
        (["train", "--gpus", "2"], "world", 2, "--gpus"),
        (["train", "--nproc", "3"], "world", 3, "--nproc"),
        (["bench", "--nproc", "2"], "world", 2, "--nproc"),
        (["bench", "--policies", "static,dcp-opt"], "policy", "static,dcp-opt", "--policies"),
        (["schedule", "--policies", "packed"], "policy", "packed", "--policies"),
        (["schedule", "--out", "s.json"], "json_out", "s.json", "--out"),
        (["calibrate", "--out", "h.json"], "json_out", Path("h.json"), "--out"),
        (["profile", "--timeout", "5"], "timeout_s", 5.0, "--timeout"),
        (["equivalence", "--timeout", "7"], "timeout_s", 7.0, "--timeout"),
        (["schedule", "--no-exact"], "exact_solver", False, "--no-exact"),
    ],
)
def test_old_names_still_work_with_a_note(argv, dest, value, note, capsys):
    assert getattr(parse(argv), dest) == value
    assert f"{note} is deprecated" in capsys.readouterr().err


def test_a_policy_list_names_known_policies(capsys):
    with pytest.raises(SystemExit):
        parse(["simulate", "--preset", "stdlib-code", "--world", "2", "--policy", "dcp-opt,fast"])
    assert "unknown policy fast" in capsys.readouterr().err


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(300 + (7919 * i) % 20_000) for i in range(40)) + "\n")
    return path


def test_schedule_reads_config_and_flags_override_it(tmp_path, lengths_file, capsys):
    config = tmp_path / "run.toml"
    config.write_text(
        '[parallelism]\nworld = 4\n[scheduling]\npolicy = "packed"\nglobal_batch_samples = 10\n'
        "drop_remainder = true\n[training]\nlr = 0.5\n"  # a key schedule does not take
    )
    argv = ["schedule", "--lengths", str(lengths_file), "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--json", "--config", str(config)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["world"], report["policy"], report["iterations"]) == (4, "packed", 4)
    assert report["samples_dropped"] == 0  # 40 samples, 10 per step: nothing left over
    assert main([*argv, "--world", "2", "--policy", "static"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["world"], report["policy"]) == (2, "static")


def test_schedule_without_world_names_the_flag_and_the_key(lengths_file, capsys):
    argv = ["schedule", "--lengths", str(lengths_file), "--policy", "static"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "datacentric schedule: --world is required (or [parallelism] world in --config)"


def test_simulate_reads_config_and_flags_override_it(tmp_path, capsys):
    config = tmp_path / "sim.toml"
    config.write_text('[parallelism]\nworld = 4\n[scheduling]\npolicy = "dcp-pac"\n')
    argv = ["simulate", "--preset", "opensora-short", "--num-samples", "64", "--json"]
    assert main([*argv, "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == 4 and list(report["policies"]) == ["static", "dcp-pac"]
    assert main([*argv, "--config", str(config), "--world", "2", "--policy", "dcp-opt"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == 2 and list(report["policies"]) == ["static", "dcp-opt"]


def test_bench_and_profile_take_their_keys_from_the_config():
    cpu = str(ROOT / "examples/configs/cpu.toml")
    bench = parse(["bench", "--config", cpu, "--dataset-limit", "3"])
    apply_config_file(bench)
    assert (bench.world, bench.policy, bench.out) == (2, "dcp-opt", "runs/cpu")
    assert (bench.dataset, bench.dataset_limit, bench.memory_gb) == ("stdlib", 3, 1.0)
    assert bench.max_tokens == 256 and bench.tokenizer is None  # not in the file: unset
    profile = parse(["profile", "--config", cpu])
    apply_config_file(profile)
    assert (profile.memory_gb, profile.world, profile.model, profile.dtype) == (
        1.0,
        2,
        "llama",
        "float32",
    )
    assert (profile.out, profile.warmup, profile.timeout_s) == (None, 2, 1800.0)  # defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[parallelism]\nwrold = 4\n", "unknown key parallelism.wrold (did you mean 'world'?)"),
        # other trainers' names get ours, as their flags do (--learning-rate: --lr)
        ("[training]\nlearning_rate = 0.1\n", "training.learning_rate (did you mean 'lr'?)"),
        ("learning_rate = 0.1\n", "unknown key 'learning_rate' (did you mean 'lr'?)"),
        ("[training]\noutput_dir = 'x'\n", "output_dir (did you mean 'out' in [job]?)"),
        ('[parallelism]\nworld = "four"\n', "parallelism.world: needs an integer"),
        ("[parallelism]\nworld = 0\n", "parallelism.world: must be >= 1"),
    ],
)
def test_simulate_config_errors_are_one_line(tmp_path, capsys, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    argv = ["simulate", "--dataset", "opensora-short", "--config", str(config)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("datacentric simulate: ") and message in err


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_config_loads_and_round_trips(example, tmp_path, capsys):
    config = load_config(example)
    assert config.model.model in MODEL_PRESETS or ":" in config.model.model
    text = example.read_text()
    data = config.data
    names_paths = any(
        data.dataset.startswith(kind) for kind in ("jsonl:", "parquet:", "text:", "latents:")
    )
    if names_paths or data.tokenizer or data.bucket_config:
        assert "# your" in text, f"{example.name}: say that its data paths are the user's"
    assert main(["config", "--show", "--config", str(example)]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    assert load_config(shown) == config


def test_examples_cover_the_documented_setups():
    names = {p.name for p in EXAMPLES}
    assert names >= {"cpu.toml", "one-gpu.toml", "node-8gpu.toml", "multi-node.toml"}
    assert names >= {"video.toml", "long-text.toml"}
    assert load_config(ROOT / "examples/configs/cpu.toml").parallelism.world == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("keep_lats = 2", "unknown key checkpoint.keep_lats (did you mean 'keep_last'?)"),
        ('keep_last = "two"', "checkpoint.keep_last: needs an integer"),
        ("keep_last = 0", "checkpoint.keep_last: must be >= 1"),
    ],
)
def test_a_bad_key_in_an_example_fails_naming_it(tmp_path, capsys, line, message):
    text = (ROOT / "examples/configs/cpu.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(re.sub(r"(?m)^keep_last = 2$", line, text))
    assert main(["config", "--show", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def readme_commands() -> list[str]:
    """Every ``datacentric ...`` command line of the README's code blocks and of its
    command table's first column."""
    text = (ROOT / "README.md").read_text()
    lines: list[str] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"^\| `(datacentric [^`]*)`", text, re.M)
    commands = []
    for line in lines:
        line = line.split("  #")[0].strip()
        match = re.search(r"(?:^|-m )datacentric (.*)$", line)
        if match:
            commands.append(match.group(1))
    return commands


def test_readme_has_command_lines():
    commands = readme_commands()
    assert len(commands) >= 12
    assert {c.split()[0] for c in commands} >= {"train", "schedule", "simulate", "plan"}


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses(command, capsys):
    argv = shlex.split(command)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --version, --help
            return
        pytest.fail(f"`datacentric {command}` does not parse: {capsys.readouterr().err}{exc}")
    if getattr(args, "config", None) is not None:
        assert (ROOT / args.config).is_file(), f"{args.config}: no such example"
        args.config = str(ROOT / args.config)
    apply_config_file(args)  # a flag required here or in the file is given
    assert "deprecated" not in capsys.readouterr().err
