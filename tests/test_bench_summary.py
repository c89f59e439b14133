"""The bench/demo summary: ratios against tuned ``static`` and ``static-reference`` at
one global batch, the simulator's largest error and whether the loss curves agree."""

from __future__ import annotations

import pytest

from datacentric.cli.bench import bench_summary
from datacentric.train.measured_comparison import PolicyMeasurement


def measurement(policy: str, seconds: float, predicted: float, losses: list[float]):
    return PolicyMeasurement(
        policy=policy,
        tokens=4000,
        steps=4,
        measured_s=seconds,
        runtime_s=seconds,
        predicted_s=predicted,
        losses=losses,
        measured_idle_share=0.1,
        est_idle_share=0.1,
        measured=None,
        predicted=None,
    )


def test_summary_reports_ratios_against_both_baselines():
    losses = [5.0, 4.0, 3.0, 2.0]
    results = {
        "static": measurement("static", 10.0, 11.0, losses),
        "static-reference": measurement("static-reference", 12.0, 12.0, losses),
        "dcp-pac": measurement("dcp-pac", 8.0, 8.0, losses),
        "dcp-opt": measurement("dcp-opt", 5.0, 6.0, [5.0, 4.0, 3.0, 2.00001]),
    }
    summary = bench_summary(results, "static")
    assert summary["best_policy"] == "dcp-opt"
    assert summary["speedup"] == pytest.approx(2.0)
    assert summary["speedup_vs_static_reference"] == pytest.approx(2.4)
    assert summary["sim_predicted_speedup"] == pytest.approx(11.0 / 6.0)
    assert summary["sim_rel_err"] == pytest.approx(0.2)
    assert summary["losses_equal"]
    assert summary["details"]["dcp-pac"]["tokens_per_step_mean"] == 1000
    results["dcp-pac"] = measurement("dcp-pac", 8.0, 8.0, [5.0, 4.0, 3.1, 2.0])
    del results["static-reference"]
    summary = bench_summary(results, "static")
    assert not summary["losses_equal"]
    assert "speedup_vs_static_reference" not in summary
