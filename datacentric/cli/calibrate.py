"""``datacentric calibrate``: fit a GPU hardware preset to measured passes.

Reads measurement files (``benchmarks/gpu_bench.py``'s report, or the block and packed
row files shipped in ``datacentric/planning/measurements/h200``), fits the preset's
rates by bounded least squares (:mod:`datacentric.planning.calibration`), and reports
the largest relative error over every measured time (``max_rel_err``), the
leave-one-shape-group-out errors (``cv_max_rel_err``, ``cv_median_rel_err``: every row
predicted by the fit to the other groups), the default held-out split
(``held_out_max_rel_err``), the fit's condition number and every fitted term (which
sit on their physical floor). ``--json-out FILE`` writes the fitted preset, which
``--hardware FILE.json`` of ``plan``, ``schedule`` and ``simulate`` loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.cli.flag_groups import add_hardware_flag, add_json_flag, add_json_out_flag
from datacentric.planning.hardware import H200_SXM_JSON

#: The measurements the shipped ``h200-sxm`` preset is fitted to.
H200_MEASUREMENTS = [
    H200_SXM_JSON.with_name("measurements") / "h200" / name
    for name in ("cost_model_h200.json", "varlen_h200.json", "packed_varlen_h200.json")
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit a GPU hardware preset to measured passes",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument(
        "--measurements",
        nargs="+",
        type=Path,
        help="measurement files (default: the three shipped H200 measurement files)",
    )
    add_hardware_flag(
        parser,
        default="h200-sxm",
        choices=("h100-sxm", "h200-sxm"),
        note="here: the device the files were measured on; its datasheet peaks start the fit",
    )
    add_json_out_flag(parser, note="here: the fitted preset", type=Path)
    add_json_flag(parser)
    parser.set_defaults(func=run)


#: What a calibration should reach (docs/planning.md): on the fit, on the worst and the
#: median row left out with its shape group.
TARGETS = {"max_rel_err": 0.10, "cv_max_rel_err": 0.20, "cv_median_rel_err": 0.08}


def run(args: argparse.Namespace) -> int:
    args.measurements = args.measurements or H200_MEASUREMENTS
    try:
        fit = _fit(args.measurements, args.hardware)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"datacentric calibrate: {err}", file=sys.stderr)
        return 2
    fit.fitted = _with_source(fit.fitted, args.measurements)
    out, errors = _report(fit)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "hardware": out["hardware"],
            "fit": {k: v for k, v in out.items() if k != "hardware"},
        }
        args.json_out.write_text(json.dumps(record, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
        return 0
    _print_report(fit, out, errors)
    if args.json_out:
        print(f"wrote {args.json_out}")
    return 0


@dataclass
class _Fit:
    """A preset fitted to measured rows, with its held-out and cross-validated errors."""

    calibration: Any
    fitted: Any
    rows: list
    held: set[str]
    held_err: float | None
    cv: list


def _fit(paths: list[Path], hardware: str) -> _Fit:
    """Read the measurement files and fit ``hardware``'s preset to them (raises
    ``OSError``, ``ValueError``, ``KeyError`` or ``TypeError`` on bad input)."""
    from datacentric.planning.calibration import (
        Calibration,
        cross_validate,
        held_out_groups,
        max_rel_err,
        read_measurements,
    )
    from datacentric.planning.hardware import datasheet_hardware
    from datacentric.profiling.factory import get_model_spec

    rows = []
    for path in paths:
        rows += read_measurements(json.loads(path.read_text()), get_model_spec)
    calibration = Calibration(datasheet_hardware(hardware), get_model_spec)
    fitted = calibration.fit(rows)
    held = held_out_groups(rows)
    train = [r for r in rows if r.group not in held]
    test = [r for r in rows if r.group in held]
    held_err = max_rel_err(calibration, calibration.fit(train), test) if test else None
    cv = cross_validate(calibration, rows) if len({r.group for r in rows}) > 1 else []
    return _Fit(calibration, fitted, rows, held, held_err, cv)


def _report(fit: _Fit) -> tuple[dict[str, Any], list]:
    """The JSON report of a fit, and its per-row errors ``(row, predicted, rel_err)``."""
    import statistics

    from datacentric.planning.calibration import relative_errors

    calibration, fitted, rows, cv = fit.calibration, fit.fitted, fit.rows, fit.cv
    errors = relative_errors(calibration, fitted, rows)
    cv_abs = [abs(e) for _, _, e in cv]
    out = {
        "hardware": fitted.to_json(),
        "rows": len(rows),
        "groups": len({r.group for r in rows}),
        "max_rel_err": max(abs(e) for _, _, e in errors),
        "cv_max_rel_err": max(cv_abs) if cv else None,
        "cv_median_rel_err": statistics.median(cv_abs) if cv else None,
        "held_out_groups": sorted(fit.held),
        "held_out_max_rel_err": fit.held_err,
        "condition_number": calibration.condition_number(fitted, rows),
        "terms": calibration.terms(fitted, rows),
        "targets": TARGETS,
        "errors": [
            {"row": r.describe(), "measured_s": r.seconds, "predicted_s": p, "rel_err": e}
            for r, p, e in errors
        ],
        "cv_errors": [{"row": r.describe(), "predicted_s": p, "rel_err": e} for r, p, e in cv],
    }
    out["meets_targets"] = all(
        out[k] is not None and out[k] <= limit for k, limit in TARGETS.items()
    )
    return out, errors


def _print_report(fit: _Fit, out: dict[str, Any], errors: list) -> None:
    """The report as text: one line per measured row, then the summary."""
    cv_of = {id(r): e for r, _, e in fit.cv}
    for row, predicted, err in errors:
        left_out = f"  left out {cv_of[id(row)]:+.3f}" if id(row) in cv_of else ""
        print(
            f"{row.describe():<36} measured {row.seconds * 1e3:9.2f} ms  "
            f"predicted {predicted * 1e3:9.2f} ms  {err:+.3f}{left_out}"
        )
    print(f"max_rel_err {out['max_rel_err']:.3f} over {len(fit.rows)} measured times")
    if fit.cv:
        print(
            f"cv_max_rel_err {out['cv_max_rel_err']:.3f}, cv_median_rel_err "
            f"{out['cv_median_rel_err']:.3f} (each of {out['groups']} shape groups left out)"
        )
    if fit.held_err is not None:
        print(
            f"held_out_max_rel_err {fit.held_err:.3f} (fit without {', '.join(sorted(fit.held))})"
        )
    print(f"condition_number {out['condition_number']:.3g}")
    floors = [t["term"] for t in out["terms"] if t["at_floor"]]
    if floors:
        print(f"at their physical floor (not pinned by these measurements): {', '.join(floors)}")
    if not out["meets_targets"]:
        limits = ", ".join(f"{k} <= {v}" for k, v in TARGETS.items())
        print(f"misses the targets ({limits})")


def _with_source(hw, paths):  # noqa: ANN001, ANN202 - small local helper
    from dataclasses import replace

    names = ", ".join(p.name for p in paths)
    return replace(hw, source=f"datacentric calibrate on {names}; peaks: {hw.source}")
