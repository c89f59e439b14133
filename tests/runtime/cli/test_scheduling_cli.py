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
    # a model without hardware: the flag it lacks, by its name (not the former --profile)
    no_hardware = ["schedule", "--lengths", str(lengths_file), "--world", "4"]
    assert main([*no_hardware, "--model", "llama-7b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("datacentric schedule: --model llama-7b prices with the analytic")
    assert "give --hardware PRESET" in err and "--profile-dir DIR" in err


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


def test_schedule_several_policies_keyed_by_name(lengths_file, capsys):
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "8"]
    argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--json"]
    assert main([*argv, "--policy", "static,megatron-dyncp,dcp-opt"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["policies"]) == {"static", "megatron-dyncp", "dcp-opt"}
    for row in report["policies"].values():
        # the per-step bound is never below the ideal bound: never a higher efficiency
        assert 0 < row["efficiency"] <= row["efficiency_step_bound"] * (1 + 1e-9)
        assert row["efficiency_step_bound"] <= 1 + 1e-9
        assert row["step_bound_epoch_time_s"] >= row["ideal_epoch_time_s"] * (1 - 1e-9)
        # charging every step's whole gradient sync never raises the efficiency
        assert 0 < row["efficiency_makespan_only"] <= row["efficiency"] * (1 + 1e-9)
    static = report["policies"]["static"]["settings"]
    assert static["sp_size"] >= 1 and static["recompute"] in ("none", "full")
    megatron = report["policies"]["megatron-dyncp"]["settings"]
    assert megatron["tokens_per_rank"] >= 1 and megatron["recompute"] in ("none", "full", "plan")
    assert main([*argv, "--policy", "static,dcp-opt", "--json-out", "x.json"]) == 2
    assert "give one --policy" in capsys.readouterr().err


@pytest.mark.parametrize("shard,model", [("fsdp2", "llama-7b"), ("none", "llama")])
def test_schedule_and_simulate_charge_the_same_epoch(shard, model, lengths_file, capsys):
    """One accounting: the scheduler's estimate and the simulator agree on the same
    schedule, the gradient sync overlapped (fsdp2) or exposed (none) alike."""
    common = ["--lengths", str(lengths_file), "--world", "8", "--model", model]
    common += ["--hardware", "h200-sxm", "--shard", shard, "--json"]
    common += ["--global-batch-samples", "8"]  # short steps: the sync weighs a few %
    assert main(["schedule", *common, "--policy", "static,dcp-opt"]) == 0
    scheduled = json.loads(capsys.readouterr().out)["policies"]
    assert main(["simulate", *common, "--policy", "static,dcp-opt"]) == 0
    simulated = json.loads(capsys.readouterr().out)["policies"]
    for policy in ("static", "dcp-opt"):
        est, sim = scheduled[policy]["efficiency"], simulated[policy]["efficiency"]
        assert est == pytest.approx(sim, rel=0.005), policy
        # fsdp2 hides the reduction behind the last backward; none exposes all of it
        exposed = scheduled[policy]["grad_sync_exposed_s"]
        assert (exposed > 0) == (shard == "none"), policy


def test_schedule_json_reports_ring_degrees_for_million_token_samples(tmp_path, capsys):
    lengths = [1 << 20] * 2 + [2048, 8192, 32768, 131072] * 40
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths)) + "\n")
    argv = ["schedule", "--lengths", str(path), "--world", "64", "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--policy", "dcp-opt", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples_scheduled"] == out["samples_total"] == len(lengths)
    assert any(r > 1 for _, r, _ in out["sp_splits"])
    assert out["efficiency"] <= 1.0 + 1e-9  # the ideal bound prices the ring options too
    assert sum(n for _, _, n in out["sp_splits"]) >= 1


def test_split_mode_ulysses_keeps_schedules_free_of_rings(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, [1 << 20] * 2 + [8192, 65536] * 30)) + "\n")
    argv = ["schedule", "--lengths", str(path), "--world", "64", "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--policy", "dcp-opt", "--json"]
    assert main([*argv, "--split-mode", "ulysses"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples_scheduled"] == 62
    assert all(r == 1 and u <= 32 for u, r, _ in out["sp_splits"])


def test_schedule_without_a_policy_runs_the_train_default(lengths_file, capsys):
    """``schedule`` with no ``--policy`` runs the policy ``train`` runs with none: the
    schema's default (one authority), dcp-opt."""
    from datacentric.settings.layout import flat_defaults

    argv = ["schedule", "--lengths", str(lengths_file), "--world", "4", "--json"]
    assert main([*argv, "--model", "llama-7b", "--hardware", "h200-sxm"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == flat_defaults()["policy"] == "dcp-opt"


def _refuse(constant):
    raise ValueError(f"not strict JSON: {constant}")


def test_samples_past_max_sp_size_get_finite_figures_and_strict_json(tmp_path, capsys):
    """4 x 400,000 + 64 x 2,000 tokens at 8 GPUs with ``--max-sp-size 2``: the long
    documents fit nothing up to 2 ranks, so the policies put them on larger groups; the
    bound prices them there (it read infinity, printed as ``Infinity``, before)."""
    path = tmp_path / "lengths.txt"
    path.write_text("400000\n" * 4 + "2000\n" * 64, encoding="utf-8")
    argv = ["schedule", "--lengths", str(path), "--world", "8", "--max-sp-size", "2"]
    argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--json"]
    assert main([*argv, "--policy", "static,dcp-pac,dcp-opt"]) == 0
    report = json.loads(capsys.readouterr().out, parse_constant=_refuse)
    for name, row in report["policies"].items():
        for key in ("efficiency", "efficiency_step_bound", "efficiency_old_bound"):
            assert 0 < row[key] <= 1 + 1e-9, (name, key)
        assert row["ideal_epoch_time_s"] > 0


def test_json_text_writes_figures_without_a_value_as_null():
    from datacentric.cli.flag_groups import json_text

    text = json_text({"a": float("inf"), "b": [float("nan"), 1.5], "c": (2, "x")})
    assert json.loads(text, parse_constant=_refuse) == {"a": None, "b": [None, 1.5], "c": [2, "x"]}
