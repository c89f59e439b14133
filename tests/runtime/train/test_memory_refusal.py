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


@pytest.mark.parametrize(("cost_model", "priced"), [("profile", True), ("analytic", False)])
def test_a_plan_the_ranks_price_over_the_budget_is_train_s_line(cost_model, priced):
    """The ranks plan with the profile they measure, which may price a sample above the
    check's analytic estimate: their refusal said 'raise the cap' and named the planning
    commands' --skip-unfittable, a flag train does not take (measured: --memory-gb 0.045
    on 6 documents, 'bucket 't<=1024' does not fit ... (0.050 GiB)'; at --world 2 'rank
    1 failed: UnfittableBucketError: ...')."""
    from toy_cost_model import ToyCostModel, toy_pipeline

    from datacentric.shapes import SampleShape
    from datacentric.train.assemble import check_plan

    shapes = [SampleShape(tokens=n) for n in (300, 9000, 1200, 700)]
    toy = ToyCostModel(capacity_bytes=8 * 2**20 + 100_000)  # 8 MiB of state, 9000 tokens over
    with pytest.raises(ValueError) as refused:
        check_plan(toy_pipeline(shapes, toy, world_size=1), cost_model)
    line = str(refused.value)
    assert line.startswith("cost.memory_gb: bucket ") and "(its longest sample: sample 1, " in line
    assert ("as the run's profile measured it" in line) is priced
    assert line.endswith(
        "raise --memory-gb, give more ranks (--world), or shorter samples (--max-tokens)"
    )
    assert "skip-unfittable" not in line
