"""``datacentric simulate`` end to end on a small preset, and the policy comparison."""

import json

import pytest

from datacentric.cli.main import main
from datacentric.data.workloads import get_workload
from datacentric.sim.policy_comparison import policy_table, run_policies, simulation_cost_model

KEYS = {"tokens_per_s", "speedup_vs_static", "idle_share", "efficiency", "efficiency_old_bound"}


def test_simulate_json_trace_and_plot(tmp_path, capsys):
    trace, plot = tmp_path / "trace.json", tmp_path / "plot.png"
    args = ["simulate", "--dataset", "opensora-short", "--dataset-limit", "255", "--world", "4"]
    args += ["--policy", "dcp-pac,dcp-opt", "--json", "--trace", str(trace)]
    args += ["--plot", str(plot)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["model"], report["hardware"], report["gpus"]) == ("stdit-1.1b", "h100-sxm", 4)
    assert list(report["policies"]) == ["static", "dcp-pac", "dcp-opt"]  # static added
    for row in report["policies"].values():
        assert KEYS <= set(row)
        assert row["tokens_per_s"] > 0 and 0 <= row["idle_share"] < 1
        assert 0 < row["efficiency"] <= 1.0 + 1e-9
        assert row["efficiency_old_bound"] > 0  # against the bound before 2026-12-03
        assert row["samples"] == 255 and row["samples_dropped"] == 0
    assert report["policies"]["static"]["speedup_vs_static"] == 1.0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e.get("cat") == "micro_batch"} == {0, 1, 2, 3}
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_simulate_lengths_file_overrides(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in [700, 1200, 900, 30_000, 500, 800] * 8))
    args = ["simulate", "--lengths", str(path), "--gpus", "8", "--hardware", "h100-sxm"]
    assert main(args + ["--policies", "static,dcp-inter", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["model"], report["hardware"]) == ("llama-7b", "h100-sxm")
    assert report["tokens"] == 8 * 34_100


def test_simulate_your_own_data_says_how_many_steps_and_why(tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    texts = ["x" * n for n in (300, 1200, 40, 800, 2500, 90, 600, 1500)] * 4
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = ["simulate", "--dataset", f"jsonl:{data}", "--world", "8", "--policy", "static,dcp-opt"]
    assert main([*args, "--global-batch-tokens", "8000"]) == 0
    out, err = capsys.readouterr()
    assert f"jsonl:{data}: 32 samples, llama-7b on 8 x h200-sxm" in out
    # no tokenizer: the lengths are bytes, and a note says so (--tokenizer bytes: chosen)
    assert f"note: jsonl:{data}: lengths counted in UTF-8 bytes, no tokenizer given" in err
    # 32 samples of 31,120 bytes in global batches of at most 8000 tokens: 4 steps or more
    steps = int(out.split("one epoch simulated: ")[1].split()[0])
    assert steps >= 4 and "global batch of 8000 tokens (--global-batch-tokens)" in out
    assert main([*args, "--json", "--tokenizer", "bytes"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    # no global batch given: sized from the 31,120 tokens as train sizes it, 8 steps
    assert report["steps"] == 8 and "sized from the dataset" in report["steps_why"]
    assert "UTF-8 bytes" not in err
    assert set(report["policies"]) == {"static", "dcp-opt"}


def test_simulate_needs_a_source(capsys):
    assert main(["simulate", "--world", "2"]) == 2
    assert "give --dataset SPEC or --lengths FILE" in capsys.readouterr().err


def test_speedups_are_throughput_ratios():
    workload = get_workload("opensora-long", num_samples=102)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 8)
    runs = run_policies(workload.shapes, cost_model, 8, ["static", "dcp-inter"])
    table = policy_table(runs)
    ratio = runs["dcp-inter"].result.tokens_per_s / runs["static"].result.tokens_per_s
    assert table["dcp-inter"]["speedup_vs_static"] == pytest.approx(ratio)
    for run in runs.values():
        run.schedule.validate()
        assert run.result.tokens == workload.num_tokens


def test_failing_policy_is_recorded_not_hidden():
    workload = get_workload("opensora-short", num_samples=51)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 4)
    errors: dict[str, str] = {}
    runs = run_policies(workload.shapes, cost_model, 4, ["static", "nope"], errors=errors)
    assert list(runs) == ["static"] and "nope" in errors["nope"]
    with pytest.raises(ValueError, match="nope"):
        run_policies(workload.shapes, cost_model, 4, ["nope"])
