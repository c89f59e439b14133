"""``datacentric calibrate``: fit a GPU hardware preset to measured passes.

Reads measurement files (``benchmarks/gpu_bench.py``'s report, or the block and packed
row files shipped in ``datacentric/planning/measurements/h200``), fits the preset's
rates by least squares (:mod:`datacentric.planning.calibration`), and reports the
largest relative error over every measured time and a held-out check: the fit repeated
on some shape groups and tested on the others. ``--json-out FILE`` writes the fitted preset, which
``--hardware FILE.json`` of ``plan``, ``schedule`` and ``simulate`` loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datacentric.cli.flags import add_json_out_flag
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
    parser.add_argument(
        "--hardware",
        default="h200-sxm",
        choices=("h100-sxm", "h200-sxm"),
        help="the device the files were measured on (its datasheet peaks start the fit)",
    )
    add_json_out_flag(parser, help="write the fitted preset to this JSON file", type=Path)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.planning.calibration import (
        Calibration,
        held_out_groups,
        max_rel_err,
        read_measurements,
        relative_errors,
    )
    from datacentric.planning.hardware import datasheet_hardware
    from datacentric.profiling.preset_specs import get_model_spec

    try:
        rows = []
        args.measurements = args.measurements or H200_MEASUREMENTS
        for path in args.measurements:
            rows += read_measurements(json.loads(path.read_text()), get_model_spec)
        calibration = Calibration(datasheet_hardware(args.hardware), get_model_spec)
        fitted = calibration.fit(rows)
        held = held_out_groups(rows)
        train = [r for r in rows if r.group not in held]
        test = [r for r in rows if r.group in held]
        held_err = max_rel_err(calibration, calibration.fit(train), test) if test else None
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"datacentric calibrate: {err}", file=sys.stderr)
        return 2
    fitted = _with_source(fitted, args.measurements)
    errors = relative_errors(calibration, fitted, rows)
    out = {
        "hardware": fitted.to_json(),
        "rows": len(rows),
        "max_rel_err": max(abs(e) for _, _, e in errors),
        "held_out_groups": sorted(held),
        "held_out_max_rel_err": held_err,
        "errors": [
            {"row": r.describe(), "measured_s": r.seconds, "predicted_s": p, "rel_err": e}
            for r, p, e in errors
        ],
    }
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
    for row, predicted, err in errors:
        print(
            f"{row.describe():<32} measured {row.seconds * 1e3:9.2f} ms  "
            f"predicted {predicted * 1e3:9.2f} ms  {err:+.3f}"
        )
    print(f"max_rel_err {out['max_rel_err']:.3f} over {len(rows)} measured times")
    if held_err is not None:
        print(f"held_out_max_rel_err {held_err:.3f} (fit without {', '.join(sorted(held))})")
    if args.json_out:
        print(f"wrote {args.json_out}")
    return 0


def _with_source(hw, paths):  # noqa: ANN001, ANN202 - small local helper
    from dataclasses import replace

    names = ", ".join(p.name for p in paths)
    return replace(hw, source=f"datacentric calibrate on {names}; peaks: {hw.source}")
