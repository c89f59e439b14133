"""The GPU measurement script runs its own code at tiny sizes on the CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def load_gpu_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks/gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_mode_writes_every_table(tmp_path: Path) -> None:
    gpu_bench = load_gpu_bench()
    out = tmp_path / "bench.json"
    assert gpu_bench.main(["--smoke", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke"
    rows = {row["model"]: row for row in report["block_times"]}
    assert set(rows) == {"llama", "dit"}
    for row in rows.values():
        for key in ("t2_s", "t4_s", "t4_recompute_s", "measured_block_s"):
            assert row[key] > 0 or key == "measured_block_s"
    (packed,) = report["packed"]
    assert packed["many"]["n"] == 8 and packed["one"]["tokens"] == packed["many"]["tokens"]
    assert packed["attention_path"] == "sdpa"
    for label in ("one", "many"):  # the kernels that ran: one SDPA call per sample on CPU
        assert packed[label]["attention_path"] == "sdpa"
        assert packed[label]["attention_calls"]["sdpa"] > 0
    # calibrate reads the report as it reads the shipped files
    from datacentric.planning.calibration import read_measurements
    from datacentric.profiling.factory import get_model_spec

    rows = read_measurements(report, get_model_spec)
    assert {r.attention_path for r in rows} == {"sdpa-per-sample"}
    assert [row["path"] for row in report["attention"]] == ["sdpa", "sdpa"]  # two layouts
    assert all(row["fwd_bwd_s"] > 0 for row in report["attention"])


def test_without_a_gpu_it_says_so(capsys) -> None:
    gpu_bench = load_gpu_bench()
    if gpu_bench.torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_bench.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_paths_taken_counts_the_kernels_that_ran() -> None:
    gpu_bench = load_gpu_bench()
    attention = gpu_bench.attention_module
    q = gpu_bench.torch.randn(12, 2, 8)
    cu_seqlens = gpu_bench.torch.tensor([0, 5, 12])
    with gpu_bench.PathsTaken() as taken:
        attention.varlen_attention(q, q, q, cu_seqlens, True)
    assert taken.calls == {"sdpa": 1} and taken.path() == "sdpa"
    assert attention._KERNELS["sdpa"] is attention._sdpa_path  # restored
