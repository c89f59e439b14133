"""End to end: ``datacentric schedule`` on a lengths file with analytic presets."""

from __future__ import annotations

import json

import pytest

from datacentric.cli.main import main
from datacentric.schedule import Schedule

KEYS = {
    "policy",
    "world",
    "iterations",
    "samples_total",
    "samples_scheduled",
    "samples_dropped",
    "efficiency",
    "imbalance_mean",
    "plan_seconds",
}


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    rows = [str(200 + (7919 * i) % 30_000) for i in range(60)] + ["90000", "# a comment", ""]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("policy", ["static", "dcp-opt"])
def test_schedule_json(policy, lengths_file, tmp_path, capsys):
    out = tmp_path / "schedule.json"
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "8", "--policy", policy]
    argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--json", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert KEYS <= set(report)
    assert report["samples_total"] == 61
    assert report["samples_scheduled"] + report["samples_dropped"] == 61
    assert 0 < report["efficiency"] <= 1
    saved = Schedule.load(str(out))
    saved.validate()
    assert saved.policy == policy and saved.world_size == 8
    assert len(saved.iterations) == report["iterations"]
    assert report["phases_per_iteration_max"] == max(it.num_phases for it in saved.iterations)


def test_schedule_drop_remainder_and_errors(lengths_file, capsys):
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "4", "--policy", "packed"]
    argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--json"]
    assert main([*argv, "--samples-per-iteration", "25", "--drop-remainder"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples_dropped"] > 0
    assert report["samples_scheduled"] + report["samples_dropped"] == 61
    assert main(["schedule", "--dataset", "no-such-set", "--world", "4", "--policy", "static"]) == 2
    assert "no-such-set" in capsys.readouterr().err


def test_schedule_from_a_saved_profile(lengths_file, tmp_path, capsys):
    from datacentric.planning.fitted import ProfilePoint
    from datacentric.profiling.store import Profile, save_profile
    from datacentric.shapes import SampleShape

    def point(sp: int, tokens: int) -> ProfilePoint:
        return ProfilePoint(
            shapes=(SampleShape.text(tokens),),
            sp_size=sp,
            base_time_s=0.01,
            block_time_s=1e-6 * tokens / sp,
            recompute_time_s=3e-7 * tokens / sp,
            base_memory_bytes=10**6,
            block_memory_bytes=1000 * tokens // sp,
            recomputed_block_memory_bytes=100 * tokens // sp,
            transient_memory_bytes=500 * tokens // sp,
        )

    profile = Profile(
        fingerprint={"model": "llama", "world_size": 2, "torch": "x", "dtype": "float32"},
        model="llama",
        num_blocks=8,
        attention_kind="causal",
        points=tuple(point(sp, n) for sp in (1, 2) for n in (128, 1024, 8192, 32768)),
        gpus_per_node=2,
        grad_sync_seconds={2: 0.003},
    )
    save_profile(profile, tmp_path)
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "2", "--policy", "dcp-opt"]
    assert main([*argv, "--profile", str(tmp_path), "--memory-gb", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cost_model"] == f"profile {tmp_path}"
    assert report["samples_scheduled"] == 61 and 0 < report["efficiency"] <= 1
