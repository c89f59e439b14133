"""What ``schedule``, ``simulate`` and ``plan`` print without ``--json``: a headline (the
epoch's time and its efficiency against the ideal bound), a short table, every figure
explained in ``--help``; ``--json`` keeps its fields."""

import json
import re

import pytest

from datacentric.cli.main import main
from datacentric.planning.hardware import gib_text

#: ``schedule --json``'s fields, in order, as they were before the human table came
SCHEDULE_FIELDS = [
    "policy", "world", "cost_model", "iterations", "samples_total", "samples_scheduled",
    "samples_dropped", "samples_skipped", "efficiency", "efficiency_makespan_only",
    "efficiency_step_bound", "efficiency_old_bound", "settings", "tokens_per_step_mean",
    "tokens_per_step_max", "imbalance_mean", "imbalance_max", "est_epoch_time_s",
    "ideal_epoch_time_s", "ideal_epoch_time_old_s", "step_bound_epoch_time_s",
    "grad_sync_exposed_s", "plan_seconds", "groups_per_iteration_mean",
    "phases_per_iteration_max", "sp_splits", "out",
]  # fmt: skip
HEADLINE = re.compile(
    r"^(\S+): one epoch in ([\d,.]+) s \((estimated|simulated)\), efficiency ([\d.]+) of the "
    r"ideal bound \(([\d,.]+) s\)$",
    re.M,
)


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(200 + (7919 * i) % 30_000) for i in range(60)) + "\n")
    return path


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def headlines(out: str) -> dict[str, tuple[float, float, float]]:
    """Policy -> (epoch s, efficiency, bound s) of each headline in ``out``."""
    return {
        m[1]: (float(m[2].replace(",", "")), float(m[4]), float(m[5].replace(",", "")))
        for m in HEADLINE.finditer(out)
    }


def test_schedule_prints_a_headline_a_table_and_a_key(lengths_file, capsys):
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "8", "--model", "llama-7b"]
    argv += ["--hardware", "h200-sxm", "--policy", "static,dcp-opt"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    out = capsys.readouterr().out
    shown = headlines(out)
    assert list(shown) == ["static", "dcp-opt"] == list(report["policies"])
    for policy, (epoch_s, efficiency, bound_s) in shown.items():
        row = report["policies"][policy]
        assert epoch_s == pytest.approx(row["est_epoch_time_s"], abs=0.051)
        assert efficiency == pytest.approx(row["efficiency"], abs=5e-4)
        assert bound_s == pytest.approx(row["ideal_epoch_time_s"], abs=0.051)
    assert "step bound" in out and "from peers" in out
    assert "60 samples on 8 ranks (analytic llama-7b on h200-sxm)" in out
    assert "efficiency_old_bound" not in out  # the raw fields are --json's
    assert len(out.splitlines()) <= 10
    key = help_text("schedule", capsys)
    assert "Reading the output" in key
    for field in [*SCHEDULE_FIELDS, "steps_from_peers", "peers_skipped", "peers_dropped"]:
        assert field in key, field


def test_schedule_json_keeps_its_fields(lengths_file, capsys):
    argv = ["schedule", "--lengths", str(lengths_file), "--world", "4", "--model", "llama-7b"]
    assert main([*argv, "--hardware", "h200-sxm", "--policy", "dcp-opt", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one JSON object on one line
    assert list(json.loads(out)) == SCHEDULE_FIELDS


def test_simulate_prints_a_headline_per_policy_and_a_key(lengths_file, capsys):
    argv = ["simulate", "--lengths", str(lengths_file), "--world", "8"]
    argv += ["--hardware", "h200-sxm", "--policy", "static,dcp-opt"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    out = capsys.readouterr().out
    first, header = out.splitlines()[:2]  # what it will do, said before the data is read
    assert first.startswith(f"datacentric simulate: static,dcp-opt on {lengths_file} at 8 ranks")
    assert header == f"lengths:{lengths_file}: 60 samples, llama-7b on 8 x h200-sxm"
    shown = headlines(out)
    assert list(shown) == ["static", "dcp-opt"]
    for policy, (epoch_s, efficiency, _) in shown.items():
        row = report["policies"][policy]
        assert epoch_s == pytest.approx(row["epoch_time_s"], abs=0.051)
        assert efficiency == pytest.approx(row["efficiency"], abs=5e-4)
    assert "vs static" in out and "recomp" in out
    key = help_text("simulate", capsys)
    for field in report["policies"]["static"]:
        assert field in key, field
    for field in report:
        assert field in key, field


def test_plan_prints_its_cap_in_gib_and_a_key_to_its_columns(capsys):
    argv = ["plan", "--model", "llama-7b", "--hardware", "h200-sxm", "--world", "8"]
    argv += ["--dataset", "sft-longtail", "--dataset-limit", "200"]
    assert main([*argv, "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)["memory_cap_bytes"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"memory cap {gib_text(cap)} GiB per rank, world 8" in out
    assert "mem GiB" in out and str(cap) not in out
    key = help_text("plan", capsys)
    for column in ("bucket", "shape", "sp, ring", "batch", "recomp", "time s", "mem GiB"):
        assert f"\n  {column} " in key, column
    assert "options" in key and "samples/GPU-s" in key


def test_profile_help_keys_the_plan_table_it_prints(capsys):
    from datacentric.cli.plan_table import TABLE_KEY

    assert help_text("profile", capsys).rstrip().endswith(TABLE_KEY.rstrip())
