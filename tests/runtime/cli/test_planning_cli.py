"""End-to-end: `datacentric plan` (analytic, saved) and `datacentric profile` on 2 gloo ranks."""

from __future__ import annotations

import json

import pytest

from datacentric.cli.main import main
from datacentric.planning.hardware import GIB
from datacentric.planning.memory_cap import device_memory_of, resolve_memory_cap
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling import Pipeline
from datacentric.shapes import SampleShape


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_from_analytic_presets(capsys, tmp_path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(["1000"] * 5 + ["30000"] * 2 + ["400000"]) + "\n")
    out = run_json(
        capsys,
        ["plan", "--model", "llama-7b", "--hardware", "h200-sxm", "--world", "32",
         "--lengths", str(lengths), "--json"],
    )  # fmt: skip
    rows = {row["bucket"]: row for row in out["buckets"]}
    assert set(rows) == {"t<=1024", "t<=32768", "t<=524288"}
    assert rows["t<=1024"]["samples"] == 5
    assert rows["t<=1024"]["sp_size"] <= rows["t<=32768"]["sp_size"] <= rows["t<=524288"]["sp_size"]
    assert all(row["est_memory_bytes"] <= out["memory_cap_bytes"] for row in rows.values())
    assert main(["plan", "--model", "llama-7b", "--hardware", "h200-sxm", "--world", "2",
                 "--lengths", str(lengths), "--memory-gb", "20"]) == 2  # fmt: skip
    assert "does not fit" in capsys.readouterr().err


def test_plan_of_a_workload_preset_takes_its_model_and_hardware(capsys) -> None:
    """``plan --dataset PRESET --world N`` plans on the preset's model and hardware, as
    ``schedule`` and ``simulate`` do with the same flags (before: "give --profile-dir DIR,
    or --model PRESET --hardware PRESET ..."); either given wins."""
    assert main(["plan", "--dataset", "stdlib-code", "--world", "8"]) == 0
    assert capsys.readouterr().out.startswith("plan from analytic llama-7b on h200-sxm")
    argv = ["plan", "--dataset", "stdlib-code", "--world", "8", "--hardware", "h100-sxm"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("plan from analytic llama-7b on h100-sxm")
    assert main(["plan", "--dataset", "stdlib-code"]) == 2  # what is missing, alone
    assert "plan: give --world N, or --profile-dir DIR" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_command_measures_plans_validates_and_reuses(capsys, tmp_path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (40, 60, 100, 200, 250, 500, 900)) + "\n")
    folder = tmp_path / "profile"
    argv = ["profile", "--model", "llama", "--lengths", str(lengths), "--world", "2",
            "--memory-gb", "0.05", "--out", str(folder), "--max-points", "2",
            "--max-profile-tokens", "256", "--validation-tokens", "1024", "--repeats", "2",
            "--json"]  # fmt: skip
    out = run_json(capsys, argv)
    assert {"buckets", "profile_seconds", "validation"} <= set(out)
    for row in out["buckets"]:
        assert {"shape", "sp_size", "micro_batch_size", "recompute", "est_time_s",
                "est_memory_bytes"} <= set(row)  # fmt: skip
        assert row["est_memory_bytes"] <= out["memory_cap_bytes"]
    validation = out["validation"]
    assert len(validation["buckets"]) == 3
    assert any(row["sp_size"] == 2 for row in validation["buckets"])
    assert all(row["num_blocks"] == 8 for row in validation["buckets"])
    # memory accounting is exact on CPU, so the extrapolation must be close
    assert validation["memory_rel_err"] <= 0.10
    assert 0 <= validation["time_rel_err"] < 10
    # the full-depth runs are measured in two sessions; their spread is reported
    assert validation["sessions"] == 2
    assert all(len(row["measured_times_s"]) == 2 for row in validation["buckets"])
    assert validation["time_noise_rel"] >= 0
    assert (folder / "profile.json").exists() and (folder / "plan.json").exists()

    again = run_json(capsys, argv)  # a fresh profile is reused, not re-measured
    assert again["profile_reused"] is True
    assert again["profile_seconds"] == out["profile_seconds"]
    shown = run_json(capsys, ["plan", "--profile", str(folder), "--json"])
    assert [r["bucket"] for r in shown["buckets"]] == [r["bucket"] for r in out["buckets"]]

    (folder / "profile.json").write_text("{broken")
    assert main(argv) == 2
    assert "corrupt profile" in capsys.readouterr().err


def test_memory_gb_becomes_the_same_cap_from_the_cli_and_the_api(capsys, tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(["300"] * 4 + ["2000"] * 2) + "\n")
    argv = ["plan", "--model", "llama", "--hardware", "cpu-local", "--world", "2"]
    argv += ["--lengths", str(lengths), "--memory-gb", "0.75", "--json"]
    assert main(argv) == 0
    cli_cap = json.loads(capsys.readouterr().out)["memory_cap_bytes"]
    shapes = [SampleShape.text(300)] * 4 + [SampleShape.text(2000)] * 2
    cost = analytic_cost_model("llama", "cpu-local")
    budget = resolve_memory_cap(0.75, device_memory_of(cost))
    api = Pipeline(shapes, cost, world_size=2, memory_cap_bytes=budget)
    assert cli_cap == api.plan.memory_cap_bytes == int(0.75 * GIB)
    schedule = api.schedule()
    assert schedule.memory_cap_bytes == schedule.meta["memory_cap_bytes"] == cli_cap


def test_a_profile_folder_without_a_plan_asks_for_the_memory_budget(tmp_path):
    """A training run's profile folder (``<out>/profile``) keeps profile.json and no
    plan.json, whose budget ``schedule --profile-dir`` takes when ``--memory-gb`` is not
    given: the line said only 'run `datacentric profile` first'."""
    import argparse

    from datacentric.cli.planning_inputs import memory_budget
    from datacentric.profiling.store import ProfileError

    (tmp_path / "profile.json").write_text("{}")
    args = argparse.Namespace(memory_gb=None, profile=str(tmp_path), memory_fraction=0.7)
    with pytest.raises(ProfileError, match=r"plan.json: no saved plan .*give --memory-gb GIB"):
        memory_budget(args, None)
    args.memory_gb = 2.0  # given: the profile's folder is not asked
    assert memory_budget(args, None) == resolve_memory_cap(2.0, None, 0.7)
