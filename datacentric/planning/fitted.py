"""A cost model fitted from profile points measured on the real device.

A :class:`ProfilePoint` is one micro-batch (its sample shapes) on one SP size,
measured by the dual-layer profiler as *components* (per rank):

- ``base``: the pass outside the repeated blocks (embedding, head, loss, model
  states outside blocks);
- ``block``: one block that keeps its activations;
- ``recompute``: what one recomputed block adds to time (its second forward) and
  what it keeps in memory (its input, its states);
- ``transient``: the extra peak bytes while a recomputed block is rematerialised;
- ``block_state``: the parameters, gradients and optimizer state of one block.

With ``L`` blocks of which the first ``k`` recompute (see :func:`extrapolate`)::

    time   = base_t + L * block_t + k * recompute_t
    memory = max(base_m + (L - k) * block_m + k * recomputed_m,                 (A)
                 base_m + (L - k) * block_state + k * recomputed_m + transient)  (B, k > 0)

(A) is the end of the forward pass (the base includes the loss head's transient);
(B) is the moment the last recomputed block is rematerialised, when the blocks after
it, which keep their activations, have already freed them in backward.

:class:`FittedCostModel` fits every component, for each profiled SP size, by
non-negative least squares on features of the micro-batch per rank: a constant,
the number of samples, tokens, and attention pairs (the quadratic term: ``s^2`` per
sample, half of it causal, per block kind as in the analytic model). Time rows are
weighted by ``1/measured`` (relative error); it then predicts any token count and
micro-batch size, so unprofiled buckets are planned without profiling them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from datacentric.planning.cost_model import CachedCostModel, PassBreakdown
from datacentric.planning.lsq import nonnegative_least_squares
from datacentric.planning.memory_cap import warn_cost_model_cap
from datacentric.planning.pass_work import attention_pairs
from datacentric.shapes import SampleShape

TIME_FIELDS = ("base_time_s", "block_time_s", "recompute_time_s")
MEMORY_FIELDS = (
    "base_memory_bytes",
    "block_memory_bytes",
    "recomputed_block_memory_bytes",
    "transient_memory_bytes",
    "block_state_bytes",
)


@dataclass(frozen=True)
class ProfilePoint:
    """Measured components of one micro-batch on one SP size (per rank)."""

    shapes: tuple[SampleShape, ...]
    sp_size: int
    base_time_s: float
    block_time_s: float
    recompute_time_s: float
    base_memory_bytes: int
    block_memory_bytes: int
    recomputed_block_memory_bytes: int
    transient_memory_bytes: int
    block_state_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shapes": [s.to_json() for s in self.shapes],
            "sp_size": self.sp_size,
        }
        for name in TIME_FIELDS + MEMORY_FIELDS:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProfilePoint:
        return cls(
            shapes=tuple(SampleShape.from_json(s) for s in d["shapes"]),
            sp_size=int(d["sp_size"]),
            **{name: float(d[name]) for name in TIME_FIELDS},
            **{name: int(d.get(name, 0)) for name in MEMORY_FIELDS},
        )


def extrapolate(point: ProfilePoint, num_blocks: int, num_recomputed: int) -> tuple[float, int]:
    """Time and peak memory of the full model (see :func:`extrapolate_breakdown`)."""
    cost = extrapolate_breakdown(point, num_blocks, num_recomputed)
    return cost.time_s, cost.memory_bytes


def extrapolate_breakdown(
    point: ProfilePoint, num_blocks: int, num_recomputed: int
) -> PassBreakdown:
    """Time split and peak memory of the full model from a point's per-block components.

    The one place the dual-layer extrapolation happens (see the module doc): a model of
    ``L`` blocks costs the measured base plus ``L`` identical blocks, the first
    ``num_recomputed`` of them adding their second forward and keeping only their input
    (the planner puts recomputed blocks first); the peak is the larger of the end of the
    forward pass and the rematerialisation of the last recomputed block.
    """
    if not 0 <= num_recomputed <= num_blocks:
        raise ValueError(f"{num_recomputed} recomputed blocks of {num_blocks}")
    kept = num_blocks - num_recomputed
    compute = point.base_time_s + num_blocks * point.block_time_s
    recompute = num_recomputed * point.recompute_time_s
    recomputed = num_recomputed * point.recomputed_block_memory_bytes
    memory = point.base_memory_bytes + kept * point.block_memory_bytes + recomputed
    if num_recomputed:
        rematerialising = (
            point.base_memory_bytes
            + kept * point.block_state_bytes
            + recomputed
            + point.transient_memory_bytes
        )
        memory = max(memory, rematerialising)
    # the profile measures all-to-all inside the block times: no separate share
    return PassBreakdown(compute + recompute, compute, recompute, 0.0, int(memory))


def features(shapes: Sequence[SampleShape], sp_size: int, kind: str) -> np.ndarray:
    """Regression features of a micro-batch per rank: 1, samples, tokens, attention pairs."""
    tokens = sum(s.tokens for s in shapes)
    pairs = sum(attention_pairs(kind, s) for s in shapes)
    return np.array([1.0, float(len(shapes)), tokens / sp_size, pairs / sp_size])


class FittedCostModel(CachedCostModel):
    """Implements :class:`~datacentric.planning.cost_model.CostModel` from profile points."""

    def __init__(
        self,
        points: Sequence[ProfilePoint],
        *,
        num_blocks: int,
        attention_kind: str,
        gpus_per_node: int,
        memory_capacity_bytes: int | None = None,
        grad_sync_seconds: dict[int, float] | None = None,
    ) -> None:
        """``attention_kind``: the blocks' attention (``causal``, ``full``, ...), for the
        quadratic feature. ``grad_sync_seconds``: measured exposed gradient sync time by
        world size (others are scaled by the ring volume ``2(n-1)/n``).
        ``memory_capacity_bytes``: deprecated and unused (the budget is the plan's)."""
        if not points:
            raise ValueError("a fitted cost model needs at least one profile point")
        self._num_blocks = num_blocks
        self.attention_kind = attention_kind
        if memory_capacity_bytes is not None:
            warn_cost_model_cap("FittedCostModel(memory_capacity_bytes=)")
        self._legacy_cap = memory_capacity_bytes
        self._gpus_per_node = gpus_per_node
        self.grad_sync_seconds = dict(grad_sync_seconds or {})
        self.points = tuple(points)
        self._coef: dict[int, dict[str, np.ndarray]] = {}
        for sp in sorted({p.sp_size for p in points}):
            self._coef[sp] = self._fit([p for p in points if p.sp_size == sp])

    def _fit(self, points: list[ProfilePoint]) -> dict[str, np.ndarray]:
        x = np.stack([features(p.shapes, p.sp_size, self.attention_kind) for p in points])
        # with fewer points than features, keep the leading ones (constant, samples, ...)
        # that the points can determine; unused coefficients stay 0.
        usable = np.flatnonzero(x.max(axis=0) > 0)[: max(1, len(points))]
        scale = x[:, usable].max(axis=0)
        coef: dict[str, np.ndarray] = {}
        for name in TIME_FIELDS + MEMORY_FIELDS:
            y = np.array([float(getattr(p, name)) for p in points])
            rows = x[:, usable] / scale
            if name in TIME_FIELDS:
                # relative error; a component measured as 0 (noise clamped at zero) is
                # weighted as the smallest non-zero one, or it would force every
                # non-negative coefficient, hence every prediction, to 0
                positive = np.abs(y)[np.abs(y) > 0]
                floor = positive.min() if positive.size else 1e-9
                weight = 1.0 / np.maximum(np.abs(y), floor)
                sol = nonnegative_least_squares(rows * weight[:, None], y * weight)
            else:
                sol = nonnegative_least_squares(rows, y)
            full = np.zeros(x.shape[1])
            full[usable] = sol / scale
            coef[name] = full
        return coef

    # --- CostModel protocol ---------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_kinds(self) -> tuple[str, ...]:
        return (self.attention_kind,) * self._num_blocks

    @property
    def memory_capacity_bytes(self) -> int:
        """Deprecated: the budget is the plan's (:mod:`datacentric.planning.memory_cap`)."""
        warn_cost_model_cap("FittedCostModel.memory_capacity_bytes")
        if self._legacy_cap is None:
            raise AttributeError("a fitted cost model holds no memory budget: see the plan's")
        return int(self._legacy_cap)

    @property
    def gpus_per_node(self) -> int:
        return self._gpus_per_node

    @property
    def sp_sizes(self) -> tuple[int, ...]:
        """The SP sizes measured (the only ones this model predicts)."""
        return tuple(self._coef)

    def supports_sp_size(self, sp_size: int) -> bool:
        return sp_size in self._coef

    def recompute_key(self, recompute: Sequence[bool]) -> Hashable:
        """The number of recomputed blocks (all blocks are alike)."""
        return self._count(recompute)

    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        if not shapes:
            raise ValueError("a micro-batch needs at least one sample")
        point = self.components(shapes, sp_size)
        return extrapolate_breakdown(point, self._num_blocks, int(key))  # type: ignore[arg-type]

    def grad_sync_time_s(self, world_size: int) -> float:
        if world_size <= 1 or not self.grad_sync_seconds:
            return 0.0
        if world_size in self.grad_sync_seconds:
            return self.grad_sync_seconds[world_size]
        ref = max(self.grad_sync_seconds)
        # ring all-reduce moves 2(n-1)/n of the gradients per rank
        return self.grad_sync_seconds[ref] * _ring(world_size) / _ring(ref)

    # --- extras ---------------------------------------------------------------------------
    def components(self, shapes: Sequence[SampleShape], sp_size: int) -> ProfilePoint:
        """The predicted components of a micro-batch (a synthetic profile point)."""
        if sp_size not in self._coef:
            raise ValueError(f"SP size {sp_size} was not profiled (profiled: {list(self._coef)})")
        f = features(shapes, sp_size, self.attention_kind)
        coef = self._coef[sp_size]
        values = {name: max(0.0, float(f @ coef[name])) for name in coef}
        return ProfilePoint(
            shapes=tuple(shapes),
            sp_size=sp_size,
            **{name: values[name] for name in TIME_FIELDS},
            **{name: int(values[name]) for name in MEMORY_FIELDS},
        )

    def _count(self, recompute: Sequence[bool]) -> int:
        if recompute and len(recompute) != self._num_blocks:
            raise ValueError(
                f"recompute has {len(recompute)} entries for {self._num_blocks} blocks"
            )
        return sum(bool(r) for r in recompute)


def _ring(ranks: int) -> float:
    return 2.0 * (ranks - 1) / ranks
