"""No command blocks on what a run folder holds: a FIFO (or another non-regular file)
where a checkpoint file, ``checkpoints/latest`` or ``metrics.jsonl`` should be makes
``inspect``, ``export``, ``plot`` and ``train --resume`` exit 2 at once, in one line
naming the file (an open of a FIFO waits for a writer: a regression would block, so each
command runs under an alarm that fails the test instead)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from run_config import SMALL_TRAIN_FLAGS, small_config
from test_reliability_cases import errors_only, run_cli
from time_limit import within

from datacentric.regular_files import NotRegularFileError, open_regular
from datacentric.train.checkpoints.checkpoint_folders import list_checkpoints
from datacentric.train.trainer import train_rank

LIMIT_S = 60


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-process run of 2 steps with a checkpoint after each."""
    out = tmp_path_factory.mktemp("special") / "run"
    train_rank(small_config(out, iterations=2, checkpoint_every=1))
    return out


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _rng_file(run: Path) -> Path:
    return list_checkpoints(run)[-1] / "rng-rank0.pt"


CASES = [
    (_rng_file, ["inspect"]),
    (_rng_file, ["export", "--out", "{tmp}/exported"]),
    (_rng_file, ["train", "--resume", "--iterations", "3", *SMALL_TRAIN_FLAGS, "--out"]),
    (lambda run: run / "checkpoints" / "latest", ["inspect"]),
    (lambda run: run / "checkpoints" / "latest", ["export", "--out", "{tmp}/exported"]),
    (
        lambda run: run / "checkpoints" / "latest",
        ["train", "--resume", "--iterations", "3", *SMALL_TRAIN_FLAGS, "--out"],
    ),
    (lambda run: run / "metrics.jsonl", ["plot"]),
    (
        lambda run: run / "metrics.jsonl",
        ["train", "--resume", "--iterations", "3", *SMALL_TRAIN_FLAGS, "--out"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("which", "command"), CASES)
def test_a_fifo_in_a_run_folder_is_refused_at_once(
    finished_run, which, command, tmp_path, capsys
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    fifo = which(run)
    _fifo(fifo)
    name, *rest = command
    rest = [part.replace("{tmp}", str(tmp_path)) for part in rest]
    argv = [name, *rest, str(run)] if name == "train" else [name, str(run), *rest]
    with within(LIMIT_S):
        status, err = run_cli(argv, capsys)
    assert status == 2, err
    (line,) = errors_only(err)
    assert line.startswith(f"datacentric {name}: ") and f"{fifo} is a FIFO" in line, line


def test_open_regular_refuses_what_is_no_file_without_blocking(tmp_path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    with within(LIMIT_S):
        for mode in ("r", "rb", "a"):
            with pytest.raises(NotRegularFileError, match="pipe is a FIFO"):
                open_regular(tmp_path / "pipe", mode)
        with pytest.raises(NotRegularFileError, match="folder is a folder"):
            open_regular(tmp_path / "folder")
    with open_regular(tmp_path / "log.jsonl", "a") as handle:
        handle.write("{}\n")
    with open_regular(tmp_path / "log.jsonl") as handle:
        assert handle.read() == "{}\n"
