"""The settings schema: torch-free, one meaning per key in every command."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from datacentric.cli.main import build_parser

#: An ``-X importtime`` line that imports torch (or one of its modules).
TORCH_LINE = re.compile(r"\|\s+torch(\.\S+)?\s*$", re.MULTILINE)


@pytest.mark.parametrize(
    "argv", [["--help"], ["train", "--help"], ["config", "--show"], ["schedule", "--help"]]
)
def test_help_and_config_show_import_no_torch(argv):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "datacentric", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "datacentric.settings" in done.stderr  # the import log is read
    assert not TORCH_LINE.findall(done.stderr), TORCH_LINE.findall(done.stderr)[:3]
    assert "usage" in done.stdout or "[job]" in done.stdout


def test_a_flag_of_a_setting_takes_its_type_and_help_from_the_schema():
    parser = build_parser()
    schedule = parser._subparsers._group_actions[0].choices["schedule"]
    action = schedule._option_string_actions["--dataset-limit"]
    assert action.type is int and "first N documents" in action.help
    assert "before long ones are chunked" in action.help  # it counts documents, not samples
    with pytest.raises(SystemExit):
        schedule.parse_args(["--dataset-limit", "many"])


def test_a_typed_section_of_the_settings():
    from datacentric.settings import load_config
    from datacentric.settings.sections import TrainingConfig

    settings = load_config(None, lr=0.01)
    training = settings.section("training")
    assert isinstance(training, TrainingConfig) and training.lr == 0.01
    with pytest.raises(KeyError, match="did you mean 'training'"):
        settings.section("trainin")


def test_a_config_that_is_no_file_is_refused_without_blocking(tmp_path) -> None:
    import os
    import signal

    from datacentric.settings import load_config
    from datacentric.settings.schema import ConfigError

    os.mkfifo(tmp_path / "run.toml")  # opening it for reading would wait for a writer
    signal.alarm(60)  # a regression fails here instead of hanging the suite
    try:
        for path, what in ((tmp_path / "run.toml", "a FIFO"), (tmp_path, "a folder")):
            with pytest.raises(ConfigError, match=f"--config {path}: is {what}"):
                load_config(path)
    finally:
        signal.alarm(0)
