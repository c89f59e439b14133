"""benchmarks/gpu_check.py: its CPU smoke mode runs every check; without a GPU it says so."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gpu_check():  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    yield _load()
    torch.set_num_threads(threads)


def test_cpu_smoke_mode_runs_every_check(gpu_check: ModuleType, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "check.json"
    code = gpu_check.main(["--device", "cpu", "--threads", "1", "--out", str(out)])
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == set(gpu_check.CHECKS)
    assert code == 0 and report["passed"] and report["mode"] == "cpu-smoke", report["failed"]
    for name in checks:
        assert name in table
    expected_skips = {"host-sync"}  # CUDA only
    if not importlib.util.find_spec("transformers"):
        expected_skips.add("hf")
    assert {n for n, c in checks.items() if c["status"] == "skip"} == expected_skips
    attention = checks["attention"]["data"]
    assert attention["default_path"] == "sdpa"  # no varlen kernel on the CPU
    for variant in ("plain", "gqa", "window"):
        assert max(attention[f"sdpa/float32/{variant}"].values()) <= 1e-4
        assert max(attention[f"sdpa/bfloat16/{variant}"].values()) <= 3e-2
    for preset in ("llama", "dit"):
        assert checks[preset]["data"]["attention_dtypes"] == ["bfloat16"]
        assert checks[preset]["data"]["grads_finite"]
    step = checks["train-step"]["data"]
    assert step["max_rel_grad_err_fp32"] <= 1e-5
    memory = checks["memory"]["data"]
    for setting in ("recompute_none", "recompute_all"):
        assert memory[setting]["measured_bytes"] > memory["model_state_bytes"]
        assert memory[setting]["predicted_bytes"] > 0
    assert (
        memory["recompute_all"]["activation_peak_bytes"]
        < memory["recompute_none"]["activation_peak_bytes"]
    )
    assert checks["compile"]["data"]["max_rel_grad_err"] <= 1e-5
    point = checks["profile"]["data"]["point"]
    assert point["block_memory_bytes"] > 0 and point["block_time_s"] >= 0


def test_a_failing_check_is_reported_and_sets_the_exit_status(
    gpu_check: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device, scale):  # type: ignore[no-untyped-def]
        raise RuntimeError("kernel missing")

    monkeypatch.setitem(gpu_check.CHECKS, "attention", broken)
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--only", "attention", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["failed"] == ["attention"]
    assert "kernel missing" in report["checks"][0]["detail"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_a_gpu_it_exits_with_a_clear_message(gpu_check: ModuleType, capsys) -> None:  # type: ignore[no-untyped-def]
    assert gpu_check.main([]) == 2
    message = capsys.readouterr().err
    assert "no CUDA GPU" in message and "--device cpu" in message
