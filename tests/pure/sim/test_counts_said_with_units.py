"""A count a command says with its unit is in the singular when it is one: ``1 rank``,
``1 sample``, ``1 step`` (they said ``1 ranks``, ``1 samples``, ``1 steps``)."""

from __future__ import annotations

import pytest

from datacentric.cli.main import main
from datacentric.scheduling.placement import too_few
from datacentric.settings import ConfigError, load_config

ANALYTIC = ["--model", "llama", "--hardware", "h100-sxm", "--world", "1"]


def test_schedule_and_simulate_of_one_sample_on_one_rank_say_it_in_the_singular(tmp_path, capsys):
    lengths = tmp_path / "one.txt"
    lengths.write_text("1000\n")
    assert main(["schedule", *ANALYTIC, "--lengths", str(lengths)]) == 0
    out, err = capsys.readouterr()
    assert f"dcp-opt on {lengths} at 1 rank with the analytic cost model" in out
    assert "1 sample on 1 rank (analytic llama on h100-sxm)" in out
    assert main(["simulate", *ANALYTIC, "--lengths", str(lengths), "--policy", "static"]) == 0
    out, err = capsys.readouterr()
    assert f"static on {lengths} at 1 rank; reading the data first" in out
    assert f"lengths:{lengths}: 1 sample, llama on 1 x h100-sxm" in out
    assert "1 ranks" not in err + out and "1 samples" not in err + out


def test_a_validation_every_past_a_one_step_run_says_one_step():
    values = {"validation_dataset": "split=0.1", "validation_every": 5, "iterations": 1}
    with pytest.raises(ConfigError, match="5 is more than the run's 1 step \\(training"):
        load_config(None, **values)


def test_too_few_micro_batches_say_one_and_name_the_flag_as_it_is_spelled():
    message = str(too_few(1, [2, 2], 2, 4))
    assert message.startswith("a global batch of 1 micro-batch cannot cover 4 ranks with ")
    assert "groups of at most 2 ranks (layout [2, 2])" in message
    assert "raise --max-sp-size (" in message and "(es)" not in message
    # the fix in both forms: a command's flags and the Python API's settings
    assert "--global-batch-tokens" in message and "tokens_per_iteration=" in message
    assert "SchedulingConfig(max_sp_size=)" in message
