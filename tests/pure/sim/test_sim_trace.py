"""Trace JSON structure and the plot writer."""

import json

from toy_schedule import SHAPES, ToyCostModel, toy_schedule

from datacentric.sim.engine import simulate
from datacentric.sim.plots import plot_results, representative_iteration
from datacentric.sim.trace import write_trace


def _result():
    return simulate(toy_schedule(), SHAPES, ToyCostModel())


def test_trace_has_one_track_per_gpu_and_nested_slices(tmp_path):
    path = tmp_path / "trace.json"
    result = _result()
    count = write_trace({"toy": result, "again": result}, str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert len(events) == count
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {(p, r): f"GPU {r}" for p in (0, 1) for r in range(4)}
    procs = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert procs == ["toy", "again"]
    slices = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    mbs = [e for e in slices if e["cat"] == "micro_batch"]
    # iteration 0: 2 ranks x 1 + 1 x 2 + 1 x 1; iteration 1: 4 ranks x 1
    assert len(mbs) == 9
    rank2 = sorted((e["ts"], e["dur"]) for e in mbs if e["tid"] == 2)
    assert rank2[:2] == [(0.0, 500000.0), (500000.0, 300000.0)]
    grads = [e for e in slices if e["name"] == "grad all-reduce"]
    assert len(grads) == 8 and {e["ts"] for e in grads} == {1.1e6, 2.72e6 - 0.5e6}
    recomputes = [e for e in slices if e["cat"] == "recompute"]
    assert len(recomputes) == 4
    for rc in recomputes:  # nested inside its micro-batch slice
        parent = max(
            (e for e in mbs if e["tid"] == rc["tid"] and e["ts"] <= rc["ts"]), key=lambda e: e["ts"]
        )
        assert rc["ts"] + rc["dur"] <= parent["ts"] + parent["dur"] + 1e-6


def test_trace_can_keep_first_iterations(tmp_path):
    path = tmp_path / "trace.json"
    write_trace(_result(), str(path), max_iterations=1)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["args"]["iteration"] for e in events if e.get("cat") == "micro_batch"} == {0}


def test_plot_writes_a_png(tmp_path):
    result = _result()
    assert representative_iteration(result).index == 0
    path = tmp_path / "plot.png"
    plot_results({"static": result, "toy": result}, str(path), title="toy")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _top_level_slices(events):
    tracks = {}
    for e in events:
        if e["ph"] == "X" and e["cat"] in ("micro_batch", "collective", "idle"):
            if e["name"] == "all-to-all (total)":
                continue
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    return tracks


def test_no_slice_overlaps_its_sibling_at_any_time_scale(tmp_path):
    import dataclasses

    result = _result()
    for scale in (1 / 7.3, 0.123456789, 3.3e-4, 1.1):
        spans = tuple(
            dataclasses.replace(s, start_s=s.start_s * scale, duration_s=s.duration_s * scale)
            for s in result.spans
        )
        scaled = dataclasses.replace(result, spans=spans, device="cpu")
        path = tmp_path / "trace.json"
        write_trace(scaled, str(path))
        events = json.loads(path.read_text())["traceEvents"]
        names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert names == {f"CPU rank {r}" for r in range(4)}
        for slices in _top_level_slices(events).values():
            slices.sort(key=lambda e: e["ts"])
            for a, b in zip(slices, slices[1:]):
                # whole nanoseconds: compare exactly
                assert round(a["ts"] * 1000) + round(a["dur"] * 1000) <= round(b["ts"] * 1000)
        for e in events:
            if e["ph"] == "X":
                assert e["ts"] * 1000 == round(e["ts"] * 1000)


def test_loss_curves_plot_from_metrics_records(tmp_path):
    from datacentric.sim.plots import plot_loss_curves

    records = [{"loss": 3.0 - k * 0.5, "tokens": 100} for k in range(4)]
    path = tmp_path / "loss.png"
    plot_loss_curves({"static": records, "dcp-opt": records[:2]}, str(path), "loss")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
