"""A memory budget nothing fits is refused before ranks start, in one line: GiB to two
significant digits, the bucket and its longest sample, and only flags ``train`` takes."""

from __future__ import annotations

import re

import pytest
from cli_here import cli_here
from run_config import SMALL_TRAIN_FLAGS

from datacentric.planning.hardware import GIB, gib_text

pytestmark = pytest.mark.usefixtures("one_thread")


def test_gib_text_keeps_two_significant_digits():
    sizes = (0.001, 0.00099, 0.04, 0.099999, 1.5, 9.96, 120)
    shown = [gib_text(int(g * GIB)) for g in sizes]
    assert shown == ["0.0010", "0.00099", "0.040", "0.10", "1.5", "10", "120"]


def test_an_impossible_memory_budget_exits_2_before_ranks_start(tmp_path, capsys):
    from datacentric.cli.main import build_parser

    out = tmp_path / "run"
    argv = ["train", *SMALL_TRAIN_FLAGS, "--memory-gb", "0.001", "--out", str(out)]
    status, _, err = cli_here(argv, capsys)
    assert status == 2, err
    (line,) = [line for line in err.splitlines() if "memory" in line]
    assert line.startswith("datacentric train: cost.memory_gb: bucket 't<=")
    assert "(its longest sample: sample " in line and "0.0010 GiB per rank" in line
    assert "0.00 GiB" not in line and "Traceback" not in err
    needed = re.search(r"needs (\S+) GiB", line).group(1)
    assert float(needed) > 0.001 and len(needed.replace("0.", "").lstrip("0")) == 2
    train = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    takes = {flag for action in train._actions for flag in action.option_strings}
    named = set(re.findall(r"--[a-z][a-z-]*", line))
    assert named and named <= takes, named - takes
    assert not (out / "config.json").exists()  # no rank started
