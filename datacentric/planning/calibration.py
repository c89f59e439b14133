"""Fit a hardware preset's constants to measured passes on a GPU.

Reads the measurement files ``benchmarks/gpu_bench.py`` writes (and the two shipped in
``planning/measurements/h200``): *block rows* (one sample through 2- and 4-block models,
the 4-block one also with every block recomputed) and *packed rows* (one long sample
against many short ones of the same tokens, 4 blocks). Every measured time becomes one
:class:`MeasuredRow`: ``t2``, ``t4``, ``t4_recompute``, the per-block time
``(t4 - t2) / 2`` and each packed micro-batch.

:func:`fit_hardware` solves for the rates of the analytic model's work
(:meth:`~datacentric.planning.analytic.AnalyticCostModel.work`) by non-negative least
squares on relative error, reweighted towards the largest errors (Lawson's iteration
for a minimax fit), over a small grid of GEMM half-efficiency token counts. Element-wise
bytes and communication keep the base preset's rates: they grow with tokens exactly as
linear-layer FLOPs do, so the matmul rate absorbs them. Pure: specs come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.hardware import Hardware
from datacentric.planning.lsq import nonnegative_least_squares
from datacentric.planning.model_specs import ModelSpec
from datacentric.shapes import SampleShape

#: ``Work.as_array`` entries fitted (the rest keep the base rates): matmul, attention
#: forward, block pass, attention backward, segment pass, segment copy, scatter,
#: modulation, recomputed block, outer operator; plus the varlen segment pass (14).
FIT_COLUMNS = (0, 1, 6, 7, 8, 9, 10, 11, 12, 13, 14)
#: GEMM half-efficiency token counts tried (``Hardware.half_efficiency_tokens``).
HALF_EFFICIENCY_GRID = (0.0, 256.0, 1024.0)
LAWSON_ITERATIONS = 40
#: the runtime's attention path names (benchmarks' ``attention_path``) -> priced path
RUNTIME_PATHS = {"sdpa": "sdpa-per-sample", "varlen": "varlen", "flash": "varlen", "flex": "varlen"}


@dataclass(frozen=True)
class PassCase:
    """One forward + backward of one micro-batch through a truncated model."""

    model: str
    depth: int
    shapes: tuple[SampleShape, ...]
    recomputed: bool = False


@dataclass(frozen=True)
class MeasuredRow:
    """One measured time: ``sum(weight * time(case))`` over ``terms`` took ``seconds``."""

    group: str
    """Shape group (``llama-7b 4096``; ``llama-7b packed 128``): held-out splits by it."""
    label: str
    """``t2``, ``t4``, ``t4_recompute``, ``block``, ``one`` or ``many``."""
    terms: tuple[tuple[float, PassCase], ...]
    seconds: float
    attention_path: str

    def describe(self) -> str:
        return f"{self.group} {self.label}"


def _shape(spec: ModelSpec, tokens: int, n: int, grid: Any) -> SampleShape:
    if grid is not None:
        return SampleShape.video(*grid)
    if tokens % n:
        raise ValueError(f"{spec.name}: {tokens} tokens do not split into {n} equal samples")
    per = tokens // n
    if any(k in ("spatial", "temporal") for k in spec.kinds):
        raise ValueError(f"{spec.name}: rows of a model with per-frame attention need a grid")
    return SampleShape.video(1, 1, per) if spec.patch_channels else SampleShape.text(per)


def read_measurements(
    data: Any, spec_of: Callable[[str], ModelSpec], default_path: str = "sdpa-per-sample"
) -> list[MeasuredRow]:
    """Rows of one measurement file's parsed JSON: a list of block rows, a list of packed
    rows, or a ``gpu_bench.json`` report (``block_times`` and ``packed``). Packed rows
    without ``attention_path`` were measured on ``default_path``; block rows (one sample,
    one segment) take the file's packed rows' path, else ``default_path``."""
    if isinstance(data, dict):
        blocks, packed = data.get("block_times", []), data.get("packed", [])
    elif isinstance(data, list):
        blocks = [r for r in data if isinstance(r, dict) and "t2_s" in r]
        packed = [r for r in data if isinstance(r, dict) and "one" in r]
        if len(blocks) + len(packed) != len(data):
            raise ValueError("rows must all be block rows (t2_s, t4_s) or packed (one, many)")
    else:
        raise ValueError("expected a list of rows or a gpu_bench report")
    paths = {RUNTIME_PATHS.get(r.get("attention_path", ""), default_path) for r in packed}
    block_path = paths.pop() if len(paths) == 1 else default_path
    rows: list[MeasuredRow] = []
    for r in blocks:
        if "error" in r:
            continue
        spec = spec_of(r["model"])
        shape = _shape(spec, int(r["tokens"]), 1, r.get("grid"))
        group = f"{r['model']} {shape.tokens}"
        case = {d: PassCase(r["model"], d, (shape,)) for d in (2, 4)}
        recomputed = PassCase(r["model"], 4, (shape,), True)
        t2, t4, tr = float(r["t2_s"]), float(r["t4_s"]), float(r["t4_recompute_s"])
        rows += [
            MeasuredRow(group, "t2", ((1.0, case[2]),), t2, block_path),
            MeasuredRow(group, "t4", ((1.0, case[4]),), t4, block_path),
            MeasuredRow(group, "t4_recompute", ((1.0, recomputed),), tr, block_path),
            MeasuredRow(
                group, "block", ((0.5, case[4]), (-0.5, case[2])), (t4 - t2) / 2, block_path
            ),
        ]
    for r in packed:
        spec = spec_of(r["model"])
        path = RUNTIME_PATHS.get(r.get("attention_path", ""), default_path)
        group = f"{r['model']} packed {r['many']['n']}"
        for label in ("one", "many"):
            x = r[label]
            shape = _shape(spec, int(x["tokens"]), int(x["n"]), x.get("grid"))
            case = PassCase(r["model"], 4, (shape,) * int(x["n"]))
            rows.append(MeasuredRow(group, label, ((1.0, case),), float(x["measured_s"]), path))
    return rows


def held_out_groups(rows: Sequence[MeasuredRow]) -> set[str]:
    """Groups a held-out check tests on: per model, the second-smallest block shape and
    the packed case with the most samples (the fit never sees their rows)."""
    held: set[str] = set()
    by_model: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for row in rows:
        model, kind, size = _group_key(row.group)
        by_model.setdefault((model, kind), []).append((size, row.group))
    for (_, kind), groups in by_model.items():
        ordered = sorted(set(groups))
        if len(ordered) < 2:
            continue
        held.add(ordered[1][1] if kind == "block" else ordered[-1][1])
    return held


def _group_key(group: str) -> tuple[str, str, int]:
    parts = group.split()
    return (
        (parts[0], "packed", int(parts[2]))
        if len(parts) == 3
        else (parts[0], "block", int(parts[1]))
    )


class Calibration:
    """Work of measured rows on a base preset, and the rates fitted to them."""

    def __init__(
        self,
        base: Hardware,
        spec_of: Callable[[str], ModelSpec],
        dtype_bytes: int = 2,
    ) -> None:
        self.base, self.spec_of, self.dtype_bytes = base, spec_of, dtype_bytes

    def _model(self, hw: Hardware, case: PassCase) -> AnalyticCostModel:
        spec = self.spec_of(case.model).truncated(case.depth)
        return AnalyticCostModel(spec, hw, dtype_bytes=self.dtype_bytes)

    def features(self, hw: Hardware, row: MeasuredRow) -> np.ndarray:
        """The row's work, one entry per rate (the segment pass split by path)."""
        total = np.zeros(15)
        for weight, case in row.terms:
            work = self._model(hw, case).work(case.shapes, 1, [case.recomputed] * case.depth)
            arr = np.append(work.as_array(), 0.0)
            if row.attention_path == "varlen":
                arr[14], arr[8], arr[9] = arr[8], 0.0, 0.0
            total += weight * arr
        return total

    def predict(self, hw: Hardware, row: MeasuredRow) -> float:
        """The row's time on the analytic model of ``hw`` priced on the row's path."""
        priced = replace(hw, attention_path=row.attention_path)
        return sum(
            weight
            * self._model(priced, case).pass_time_s(case.shapes, 1, [case.recomputed] * case.depth)
            for weight, case in row.terms
        )

    def fit(self, rows: Sequence[MeasuredRow], name: str | None = None) -> Hardware:
        """The base preset with its rates fitted to ``rows`` (see module doc)."""
        if len(rows) < len(FIT_COLUMNS):
            raise ValueError(f"calibration needs at least {len(FIT_COLUMNS)} rows, got {len(rows)}")
        best: tuple[float, Hardware] | None = None
        for half in HALF_EFFICIENCY_GRID:
            hw = self._fit_at(replace(self.base, half_efficiency_tokens=half), rows, name)
            err = max_rel_err(self, hw, rows)
            if best is None or err < best[0]:
                best = (err, hw)
        assert best is not None
        return best[1]

    def _fit_at(self, base: Hardware, rows: Sequence[MeasuredRow], name: str | None) -> Hardware:
        feats = np.array([self.features(base, r) for r in rows])
        secs = np.array([r.seconds for r in rows])
        rates = _rates(base)
        fixed = [i for i in range(feats.shape[1]) if i not in FIT_COLUMNS]
        target = secs - feats[:, fixed] @ rates[fixed]
        used = [i for i in FIT_COLUMNS if np.abs(feats[:, i]).max() > 0]
        scale = np.abs(feats[:, used]).max(axis=0)
        a = feats[:, used] / scale / secs[:, None]
        b = target / secs
        weights = np.full(len(rows), 1.0 / len(rows))
        for _ in range(LAWSON_ITERATIONS):
            root = np.sqrt(weights)
            coef = nonnegative_least_squares(a * root[:, None], b * root)
            weights = weights * (np.abs(a @ coef - b) + 1e-12)
            weights /= weights.sum()
        fitted = rates.copy()
        fitted[used] = coef / scale
        return _with_rates(base, fitted, name)


def _rates(hw: Hardware) -> np.ndarray:
    per_sample = replace(hw, attention_path="sdpa-per-sample").seconds_per_unit()
    return np.append(per_sample, hw.varlen_segment_overhead_s)


def _with_rates(base: Hardware, r: np.ndarray, name: str | None) -> Hardware:
    def eff(rate: float, peak: float) -> float:
        return 1e3 if rate <= 0 else float(min(1.0 / (rate * peak), 1e3))

    return replace(
        base,
        name=name or base.name,
        matmul_efficiency=eff(r[0], base.peak_flops),
        attention_efficiency=eff(r[1], base.peak_flops),
        block_overhead_s=float(r[6]),
        attention_backward_efficiency=eff(r[7], base.peak_flops),
        segment_overhead_s=float(r[8]),
        segment_copy_s_per_byte=float(r[9]),
        scatter_s_per_element=float(r[10]),
        modulation_s_per_element=float(r[11]),
        recompute_overhead_s=float(r[12]),
        op_launch_s=float(r[13]),
        varlen_segment_overhead_s=float(r[14]),
    )


def relative_errors(
    calibration: Calibration, hw: Hardware, rows: Iterable[MeasuredRow]
) -> list[tuple[MeasuredRow, float, float]]:
    """``(row, predicted_s, relative error)`` of every row."""
    out = []
    for row in rows:
        predicted = calibration.predict(hw, row)
        out.append((row, predicted, predicted / row.seconds - 1.0))
    return out


def max_rel_err(calibration: Calibration, hw: Hardware, rows: Iterable[MeasuredRow]) -> float:
    """The largest ``|predicted / measured - 1|`` over ``rows``."""
    return max(abs(e) for _, _, e in relative_errors(calibration, hw, rows))
