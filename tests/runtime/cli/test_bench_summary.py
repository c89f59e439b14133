"""The bench/demo summary: ratios of medians against tuned ``static`` and
``static-reference`` at one global batch, the speedup as a range over the pairings of
repeats with its verdict, the spread between repeats, the simulator's error against the
median, whether the loss curves agree, and the machine's load."""

from __future__ import annotations

import pytest

from datacentric.cli.comparison_report import bench_summary, describe_speedup, noise_verdict
from datacentric.cli.main import main
from datacentric.timing import relative_spread
from datacentric.train.comparison.machine_load import LoadReading
from datacentric.train.comparison.measured_comparison import (
    Comparison,
    PolicyMeasurement,
    PolicyRepeats,
    repeat_folder,
    run_order,
    speedup_range,
)

IDLE = LoadReading(
    cores=2, ranks=2, before=(0.1, 0.2, 0.3), after=(1.9, 0.9, 0.5), rank_cpu_s=190, rank_wall_s=200
)
LOSSES = [5.0, 4.0, 3.0, 2.0]


def measurement(policy: str, seconds: float, predicted: float, losses=LOSSES, runtime=None):
    return PolicyMeasurement(
        policy=policy,
        tokens=4000,
        steps=4,
        measured_s=seconds,
        runtime_s=seconds if runtime is None else runtime,
        predicted_s=predicted,
        losses=losses,
        measured_idle_share=0.1,
        est_idle_share=0.1,
        measured=None,
        predicted=None,
    )


def repeats(policy: str, seconds: list[float], predicted: float, losses=LOSSES) -> PolicyRepeats:
    return PolicyRepeats(policy, tuple(measurement(policy, s, predicted, losses) for s in seconds))


def comparison(*policies: PolicyRepeats, load: LoadReading = IDLE) -> Comparison:
    return Comparison(policies={p.policy: p for p in policies}, load=load)


def test_summary_reports_median_ratios_ranges_and_noise():
    summary = bench_summary(
        comparison(
            repeats("static", [10.0, 11.0, 12.0], 11.0),
            repeats("static-reference", [12.0, 12.0, 12.0], 12.0),
            repeats("dcp-pac", [8.0, 8.0, 8.0], 8.0),
            repeats("dcp-opt", [5.0, 5.5, 6.0], 6.0, [5.0, 4.0, 3.0, 2.00001]),
        ),
        "static",
    )
    assert summary["best_policy"] == "dcp-opt"
    # medians: 11 s and 5.5 s -> 2.0x; pairings: 10/6 .. 12/5
    assert summary["speedup"] == pytest.approx(2.0)
    assert summary["speedup_min"] == pytest.approx(10.0 / 6.0)
    assert summary["speedup_max"] == pytest.approx(12.0 / 5.0)
    assert summary["verdict"] == "faster"
    assert summary["repeats"] == 3
    assert summary["noise_rel"] == pytest.approx(0.2)  # static: (12 - 10) / 10
    assert summary["speedup_vs_static_reference"] == pytest.approx(12.0 / 5.5)
    assert summary["speedup_vs_static_reference_min"] == pytest.approx(2.0)
    assert summary["sim_predicted_speedup"] == pytest.approx(11.0 / 6.0)
    # against the median: dcp-opt (6 - 5.5) / 5.5 is the largest
    assert summary["sim_rel_err"] == pytest.approx(0.5 / 5.5)
    assert summary["losses_equal"]
    assert summary["details"]["dcp-pac"]["tokens_per_step_mean"] == 1000
    assert summary["details"]["static"]["measured_s_runs"] == [10.0, 11.0, 12.0]
    assert summary["load_average"] == {"before": [0.1, 0.2, 0.3], "after": [1.9, 0.9, 0.5]}
    assert not summary["under_load"]
    assert describe_speedup(summary, "static") == (
        "2.00x static (range 1.67-2.40x over 3 repeats, noise 20.0%): faster"
    )


def test_a_range_that_includes_one_is_within_noise():
    summary = bench_summary(
        comparison(repeats("static", [10.0, 10.6], 10.0), repeats("dcp-opt", [9.9, 10.8], 9.0)),
        "static",
    )
    assert summary["speedup_min"] <= 1.0 <= summary["speedup_max"]
    assert summary["speedup_min"] <= summary["speedup"] <= summary["speedup_max"]
    assert summary["verdict"] == "within noise"
    assert "within noise" in describe_speedup(summary)
    assert "speedup_vs_static_reference" not in summary
    assert noise_verdict(0.9, 0.8, 0.95) == "slower"
    # a ratio of medians no further from 1.0 than one policy's run-to-run spread
    assert noise_verdict(1.5, 1.3, 1.9, noise_rel=0.57) == "within noise"
    assert noise_verdict(0.7, 0.6, 0.8, noise_rel=0.5) == "within noise"
    assert noise_verdict(1.5, 1.3, 1.9, noise_rel=0.2) == "faster"


def test_losses_of_every_repeat_must_agree():
    drifted = PolicyRepeats(
        "dcp-opt",
        (measurement("dcp-opt", 5.0, 5.0), measurement("dcp-opt", 5.0, 5.0, [5.0, 4.0, 3.1, 2.0])),
    )
    summary = bench_summary(comparison(repeats("static", [9.0, 9.0], 9.0), drifted), "static")
    assert not summary["losses_equal"]


def test_speedup_range_holds_the_ratio_of_medians():
    a = repeats("dcp-opt", [4.0, 7.0, 5.0, 6.5], 5.0)
    b = repeats("static", [6.0, 5.0, 8.0], 6.0)
    low, high = speedup_range(a, b)
    assert low <= a.tokens_per_s / b.tokens_per_s <= high
    assert relative_spread([4.0, 7.0, 5.0]) == pytest.approx(0.75)
    assert relative_spread([3.0]) == 0.0


def test_runs_are_interleaved_round_by_round(tmp_path):
    assert run_order(["a", "b"], 2) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert repeat_folder(tmp_path, "a", 0) == tmp_path / "a"
    assert repeat_folder(tmp_path, "a", 1) == tmp_path / "repeat-2" / "a"


def test_load_reading_says_when_the_machine_was_busy():
    assert not IDLE.under_load
    assert "otherwise idle" in IDLE.describe()
    busy_before = LoadReading(
        cores=2, ranks=2, before=(8.5, 9, 9), after=(9, 9, 9), rank_cpu_s=190, rank_wall_s=200
    )
    assert busy_before.under_load and "UNDER LOAD" in busy_before.describe()
    # others' load after the run, less the ranks' own
    assert LoadReading(
        cores=2, ranks=2, before=(0.1, 0, 0), after=(4.0, 2, 1), rank_cpu_s=190, rank_wall_s=200
    ).under_load
    starved = LoadReading(
        cores=2, ranks=2, before=(0.1, 0, 0), after=(2.0, 1, 1), rank_cpu_s=60, rank_wall_s=200
    )
    assert starved.cpu_share == pytest.approx(0.3)
    assert starved.under_load
    assert starved.to_json()["under_load"] is True


def test_bench_refuses_fewer_than_one_repeat(capsys):
    assert main(["bench", "--runs-per-policy", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["datacentric bench: --runs-per-policy 0: give at least 1"], err


def test_bench_prints_a_headline_a_table_and_a_key(capsys):
    from datacentric.cli.bench import human_summary

    summary = bench_summary(
        comparison(
            repeats("static", [10.0, 11.0, 12.0], 11.0),
            repeats("static-reference", [12.0, 12.0, 12.0], 12.0),
            repeats("dcp-opt", [5.0, 5.5, 6.0], 6.0),
        ),
        "static",
    )
    summary["world"] = 2
    lines = human_summary(summary).splitlines()
    assert lines[0] == (
        "static: 4 steps in 11.00 s measured (median of 3 runs), 364 tokens/s; simulated 11.00 s"
    )
    assert lines[2].startswith("dcp-opt: 4 steps in 5.50 s measured (median of 3 runs), 727 ")
    assert lines[3] == (
        f"dcp-opt at {describe_speedup(summary, 'static')}; simulated {11.0 / 6.0:.2f}x"
    )
    assert lines[5].split() == ["policy", "tok/s", "noise", "sim", "err", "idle", "loss"]
    assert lines[6].split()[:4] == ["static", "364", "20.0%", "0.0%"]
    assert "losses equal across policies: yes" in lines
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    key = capsys.readouterr().out
    assert "Reading the output" in key
    for field in [*summary, *summary["details"]["static"]]:
        assert field in key, field
