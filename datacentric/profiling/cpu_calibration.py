"""Calibrate the ``cpu-local`` hardware preset from measured passes of this machine.

Runs the runnable ``llama`` preset through the real runtime on two gloo ranks
(:func:`~datacentric.profiling.profiler.measure`): several token counts and
micro-batch sizes, SP 1 and 2, with and without recomputation, at depth 2 and at
full depth. Each measured pass is decomposed into the work the analytic model
charges for (the analytic model's ``work`` of the truncated spec) and
:func:`~datacentric.planning.hardware.calibrate_hardware` fits the rates.
``python -m datacentric.profiling.cpu_calibration`` rewrites ``cpu_local.json``.

The starting constants (``CPU_BASE``) describe one core per rank: each rank runs
one intra-op thread, as the profiler and the runtime's launcher use on this machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from datacentric.planning.hardware import (
    CPU_LOCAL_JSON,
    CalibrationPoint,
    Hardware,
    calibrate_hardware,
)
from datacentric.planning.model_specs import ModelSpec
from datacentric.profiling.factory import analytic_cost_model, get_model_spec
from datacentric.profiling.profiler import ProfileSettings, RunCase, RunResult, measure
from datacentric.settings.sections import CostConfig
from datacentric.shapes import SampleShape

CPU_BASE = Hardware(
    name="cpu-local",
    gpus_per_node=os.cpu_count() or 1,  # every rank is a process on this one machine
    # approximate nominal peak of one x86 core with two 256-bit FMA units at ~2.45 GHz:
    # 2 units x 8 fp32 lanes x 2 FLOP x 2.45e9 = 78.4 GFLOP/s (fp32 training on CPU)
    peak_flops=78.4e9,
    memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    memory_bandwidth=20e9,  # approximate share of DDR bandwidth of one core
    intra_node_bandwidth=5e9,  # approximate loopback TCP (gloo) bandwidth
    inter_node_bandwidth=1e9,  # unused: one machine
    matmul_efficiency=0.5,  # starting values only: calibrate_hardware fits them
    attention_efficiency=0.25,
    memory_efficiency=1.0,
    network_efficiency=1.0,
    collective_latency_s=100e-6,
    block_overhead_s=1e-3,
    source="fitted to measured passes of this machine (datacentric.profiling.cpu_calibration)",
)


def calibration_cases(spec: ModelSpec, world_size: int) -> list[RunCase]:
    """Passes to measure: token counts and batches at depth 2 and full depth."""
    sizes = [s for s in (1, 2) if world_size % s == 0]
    batches = [
        (SampleShape.text(256),) * 4,
        (SampleShape.text(512),),
        (SampleShape.text(1024),),
        (SampleShape.text(2048),),
        (SampleShape.text(4096),),
    ]
    cases = []
    for sp in sizes:
        for mb in batches:
            for recompute in (False, True):
                cases.append(RunCase(mb, sp, 2, recompute))
        cases.append(RunCase((SampleShape.text(2048),), sp, spec.num_blocks, False))
        cases.append(RunCase((SampleShape.text(1024),) * 2, sp, spec.num_blocks, True))
    return cases


def calibration_points(
    spec: ModelSpec, results: Sequence[RunResult], dtype_bytes: int = 4
) -> list[CalibrationPoint]:
    """Decompose measured passes into the analytic model's work."""
    points = []
    for r in results:
        case = r.case
        model = analytic_cost_model(spec.truncated(case.depth), CPU_BASE, dtype_bytes=dtype_bytes)
        w = model.work(case.shapes, case.sp_size, case.flags())
        points.append(
            CalibrationPoint(
                matmul_flops=w.matmul_flops,
                attention_flops=w.all_attention_flops,
                memory_bytes=w.memory_bytes,
                network_bytes=w.nvlink_bytes + w.ib_bytes,
                collectives=w.collectives,
                block_passes=w.block_passes,
                seconds=r.time_s,
            )
        )
    return points


def calibrate_cpu_local(
    model: str = "llama", world_size: int = 2, repeats: int = 3
) -> tuple[Hardware, dict[str, Any]]:
    """Measure this machine and fit ``cpu-local``; returns it and the measured record."""
    import torch

    spec = get_model_spec(model)
    cases = calibration_cases(spec, world_size)
    settings = ProfileSettings(
        model=model, world_size=world_size, cost=CostConfig(repeats=repeats), spec=spec
    )
    results = measure(cases, settings)
    fitted = calibrate_hardware(CPU_BASE, calibration_points(spec, results))
    fitted = replace(fitted, half_efficiency_tokens=0.0)
    check = []
    for r in results:
        predicted = analytic_cost_model(
            spec.truncated(r.case.depth), fitted, dtype_bytes=4
        ).pass_time_s(r.case.shapes, r.case.sp_size, r.case.flags())
        check.append(
            {
                "tokens": [s.tokens for s in r.case.shapes],
                "sp_size": r.case.sp_size,
                "depth": r.case.depth,
                "recompute": bool(any(r.case.flags())),
                "measured_s": r.time_s,
                "predicted_s": predicted,
            }
        )
    record = {
        "model": model,
        "world_size": world_size,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "passes": check,
        "max_rel_err": max(
            abs(c["predicted_s"] - c["measured_s"]) / c["measured_s"] for c in check
        ),
    }
    return fitted, record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(CPU_LOCAL_JSON))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    hardware, record = calibrate_cpu_local(repeats=args.repeats)
    Path(args.out).write_text(
        json.dumps({"hardware": hardware.to_json(), "measured": record}, indent=1) + "\n"
    )
    print(f"wrote {args.out}: max relative error {record['max_rel_err']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
