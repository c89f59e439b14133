"""Fit a hardware preset's constants to measured passes on a GPU, and cross-validate it.

Reads the measurement files ``benchmarks/gpu_bench.py`` writes (and the three shipped in
``planning/measurements/h200``): *block rows* (one sample through 2- and 4-block models,
the 4-block one also with every block recomputed) and *packed rows* (one long sample
against many short ones of the same tokens, 4 blocks). Every measured time becomes one
:class:`MeasuredRow`: ``t2``, ``t4``, ``t4_recompute``, the per-block time
``(t4 - t2) / 2`` and each packed micro-batch.

:meth:`Calibration.fit` solves for the rates of the analytic model's work
(:meth:`~datacentric.planning.analytic.AnalyticCostModel.work`, one rate per
:data:`TERMS` entry) by bounded least squares on relative error: every rate of work
that a datasheet peak bounds is at least ``1 / peak`` (efficiency in (0, 1]) and every
overhead is at least 0. Attention forward and backward FLOPs share one rate (their
columns are nearly proportional, so two rates would be collinear). Communication keeps
the base preset's rates (the measurements are on one GPU). The GEMM half-efficiency
token count is chosen from a small grid by the fit's largest error.

:func:`cross_validate` refits with each *shape group* left out (one model at one token
count, with every packed case whose one long sample has that count: a packed case and
its one-sample twin, which is the same shape as a block row, are never split) and
predicts the group's rows. Pure: specs come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.hardware import Hardware
from datacentric.planning.lsq import bounded_least_squares
from datacentric.planning.model_specs import ModelSpec
from datacentric.shapes import SampleShape

#: Fitted terms: name, the ``Work.as_array`` entries (plus 14, the varlen segment pass)
#: its rate prices, and its lower bound: ``flop`` (``1 / peak_flops``), ``byte``
#: (``1 / memory_bandwidth``) or 0. Entries 3-5 (communication) keep the base rates.
TERMS = (
    ("matmul", (0,), "flop"),
    ("attention", (1, 7), "flop"),
    ("memory", (2,), "byte"),
    ("block_pass", (6,), None),
    ("segment_pass", (8,), None),
    ("segment_copy", (9,), "byte"),
    ("scatter", (10,), None),
    ("modulation", (11,), None),
    ("recomputed_block", (12,), None),
    ("outer_op", (13,), None),
    ("varlen_segment_pass", (14,), None),
)
FIXED_COLUMNS = (3, 4, 5)
#: GEMM half-efficiency token counts tried (``Hardware.half_efficiency_tokens``).
HALF_EFFICIENCY_GRID = (0.0, 256.0, 1024.0)
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
    """Shape group (``llama-7b 16384``): one model at one token count, with the packed
    cases whose one long sample has that many tokens. Cross-validation holds it out whole."""
    label: str
    """``t2``, ``t4``, ``t4_recompute``, ``block``, or ``packed N one`` / ``packed N many``."""
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
        group = f"{r['model']} {int(r['one']['tokens'])}"
        for label in ("one", "many"):
            x = r[label]
            taken = x.get("attention_path")  # the kernels this pass ran (gpu_bench)
            if taken is not None and taken not in RUNTIME_PATHS:
                raise ValueError(
                    f"{r['model']} packed {label}: attention_path {taken!r} mixes kernels; "
                    f"the cost model prices one of {sorted(RUNTIME_PATHS)} per pass"
                )
            priced = RUNTIME_PATHS[taken] if taken is not None else path
            shape = _shape(spec, int(x["tokens"]), int(x["n"]), x.get("grid"))
            case = PassCase(r["model"], 4, (shape,) * int(x["n"]))
            name = f"packed {r['many']['n']} {label}"
            row = MeasuredRow(group, name, ((1.0, case),), float(x["measured_s"]), priced)
            rows.append(row)
    return rows


def held_out_groups(rows: Sequence[MeasuredRow]) -> set[str]:
    """The default held-out split: per model, the second-smallest shape group."""
    by_model: dict[str, set[int]] = {}
    for row in rows:
        model, tokens = row.group.rsplit(" ", 1)
        by_model.setdefault(model, set()).add(int(tokens))
    return {f"{m} {sorted(t)[1]}" for m, t in by_model.items() if len(t) >= 2}


class Calibration:
    """Work of measured rows on a base preset, and the rates fitted to them."""

    def __init__(
        self,
        base: Hardware,
        spec_of: Callable[[str], ModelSpec],
        dtype_bytes: int = 2,
    ) -> None:
        self.base, self.spec_of, self.dtype_bytes = base, spec_of, dtype_bytes
        self._features: dict[tuple[float, MeasuredRow], np.ndarray] = {}

    def _model(self, hw: Hardware, case: PassCase) -> AnalyticCostModel:
        spec = self.spec_of(case.model).truncated(case.depth)
        return AnalyticCostModel(spec, hw, dtype_bytes=self.dtype_bytes)

    def features(self, hw: Hardware, row: MeasuredRow) -> np.ndarray:
        """The row's work, one entry per rate (the segment pass split by path)."""
        key = (hw.half_efficiency_tokens, row)
        if key in self._features:
            return self._features[key]
        total = np.zeros(15)
        for weight, case in row.terms:
            work = self._model(hw, case).work(case.shapes, 1, [case.recomputed] * case.depth)
            arr = np.append(work.as_array(), 0.0)
            if row.attention_path == "varlen":
                arr[14], arr[8], arr[9] = arr[8], 0.0, 0.0
            total += weight * arr
        self._features[key] = total
        return total

    def design(self, hw: Hardware, rows: Sequence[MeasuredRow]) -> np.ndarray:
        """Each row's work per fitted term (one column per :data:`TERMS` entry)."""
        feats = np.array([self.features(hw, r) for r in rows])
        return np.stack([feats[:, list(cols)].sum(axis=1) for _, cols, _ in TERMS], axis=1)

    def lower_bounds(self) -> np.ndarray:
        """The physical floor of every term's rate (see :data:`TERMS`)."""
        floor = {"flop": 1.0 / self.base.peak_flops, "byte": 1.0 / self.base.memory_bandwidth}
        return np.array([floor.get(bound, 0.0) for _, _, bound in TERMS])  # type: ignore[arg-type]

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
        if len(rows) < len(TERMS):
            raise ValueError(f"calibration needs at least {len(TERMS)} rows, got {len(rows)}")
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
        if np.any(secs <= 0):
            raise ValueError("calibration needs positive measured seconds")
        fixed = list(FIXED_COLUMNS)
        target = secs - feats[:, fixed] @ _rates(base)[fixed]
        x = self.design(base, rows)
        used = np.abs(x).max(axis=0) > 0
        scale = np.abs(x[:, used]).max(axis=0)
        a = x[:, used] / scale / secs[:, None]  # relative error: every row counts alike
        coef = bounded_least_squares(a, target / secs, self.lower_bounds()[used] * scale)
        fitted = np.full(len(TERMS), np.nan)
        fitted[used] = coef / scale
        return _with_rates(base, fitted, name)

    def condition_number(self, hw: Hardware, rows: Sequence[MeasuredRow]) -> float:
        """2-norm condition number of the fit's design (relative rows, unit columns):
        how much the fitted rates can move for a small change of the measurements."""
        secs = np.array([r.seconds for r in rows])
        a = self.design(hw, rows) / secs[:, None]
        a = a[:, np.abs(a).max(axis=0) > 0]
        return float(np.linalg.cond(a / np.linalg.norm(a, axis=0)))

    def terms(self, hw: Hardware, rows: Sequence[MeasuredRow]) -> list[dict[str, Any]]:
        """Every fitted term's rate, floor and whether it sits on the floor (the
        measurements then do not pin it) or has no work in ``rows`` (kept from the base)."""
        rates, floors = _term_rates(hw), self.lower_bounds()
        work = np.abs(self.design(hw, rows)).max(axis=0)
        return [
            {
                "term": name,
                "rate": float(rate),
                "floor": float(floor),
                "at_floor": bool(work[i] > 0 and rate <= floor * (1 + 1e-9)),
                "measured": bool(work[i] > 0),
            }
            for i, ((name, _, _), rate, floor) in enumerate(zip(TERMS, rates, floors))
        ]


def _rates(hw: Hardware) -> np.ndarray:
    per_sample = replace(hw, attention_path="sdpa-per-sample").seconds_per_unit()
    return np.append(per_sample, hw.varlen_segment_overhead_s)


def _term_rates(hw: Hardware) -> np.ndarray:
    """The rate of every :data:`TERMS` entry in ``hw`` (attention: the forward's)."""
    rates = _rates(hw)
    return np.array([rates[cols[0]] for _, cols, _ in TERMS])


def _with_rates(base: Hardware, r: np.ndarray, name: str | None) -> Hardware:
    """``base`` with the fitted term rates ``r`` (NaN: no work in the rows, keep base)."""
    kept = _term_rates(base)
    r = np.where(np.isnan(r), kept, r)

    def eff(rate: float, peak: float) -> float:
        return float(min(1.0, 1.0 / (rate * peak)))  # rate >= 1 / peak: rounding only

    return replace(
        base,
        name=name or base.name,
        matmul_efficiency=eff(r[0], base.peak_flops),
        attention_efficiency=eff(r[1], base.peak_flops),
        attention_backward_efficiency=0.0,  # one rate for forward and backward
        memory_efficiency=eff(r[2], base.memory_bandwidth),
        block_overhead_s=float(r[3]),
        segment_overhead_s=float(r[4]),
        segment_copy_s_per_byte=float(r[5]),
        scatter_s_per_element=float(r[6]),
        modulation_s_per_element=float(r[7]),
        recompute_overhead_s=float(r[8]),
        op_launch_s=float(r[9]),
        varlen_segment_overhead_s=float(r[10]),
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


def cross_validate(
    calibration: Calibration, rows: Sequence[MeasuredRow]
) -> list[tuple[MeasuredRow, float, float]]:
    """Leave-one-shape-group-out: ``(row, predicted_s, relative error)`` of every row,
    predicted by the fit to all the other groups' rows."""
    out: dict[int, tuple[MeasuredRow, float, float]] = {}
    for group in sorted({r.group for r in rows}):
        train = [r for r in rows if r.group != group]
        hw = calibration.fit(train)
        for i, row in enumerate(rows):
            if row.group == group:
                out[i] = relative_errors(calibration, hw, [row])[0]
    return [out[i] for i in range(len(rows))]
