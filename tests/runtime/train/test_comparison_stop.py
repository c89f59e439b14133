"""``demo`` and ``bench`` stopped by a signal say in one line which runs they finished."""

from __future__ import annotations

import os
import signal

import pytest
from run_config import small_config

from datacentric.cli.main import main
from datacentric.train.comparison import measured_comparison
from datacentric.train.comparison.comparison_stop import ComparisonStopped


def test_sigterm_between_runs_names_the_finished_run(tmp_path, monkeypatch) -> None:
    """A real first run, then SIGTERM to this process as the second starts."""
    real, started = measured_comparison.run_policy, []

    def run_policy(config, world_size, prechecked=None):
        started.append(config.scheduling.policy)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(config, world_size, prechecked)

    monkeypatch.setattr(measured_comparison, "run_policy", run_policy)
    before = signal.getsignal(signal.SIGTERM)
    base = small_config(tmp_path / "base", progress=False)
    with pytest.raises(ComparisonStopped) as stop:
        measured_comparison.compare_policies(base, ["static", "dcp-opt"], 2, tmp_path, repeats=1)
    assert stop.value.signum == signal.SIGTERM and stop.value.finished == [("static", 0)]
    assert str(stop.value).startswith("stopped by SIGTERM after 1 of 2 runs (static run 1; ")
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is given back
    assert (tmp_path / "static" / "metrics.jsonl").exists()


def test_bench_interrupted_says_so_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    def interrupted(config, world_size, prechecked=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(measured_comparison, "run_policy", interrupted)
    argv = ["bench", "--policy", "static,dcp-opt", "--runs-per-policy", "1"]
    assert main([*argv, "--dataset-limit", "2", "--out", str(tmp_path), "--json"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "datacentric bench: stopped by SIGINT after 0 of 2 runs (none finished); no "
        "comparison without every run: run the command again"
    )
