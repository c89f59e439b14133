"""Forward-only passes priced on a training cost model (pure: no torch).

A validation pass runs the model's forward under ``torch.no_grad``: no backward, no
recomputation, no activation kept for a backward. :class:`ForwardOnlyCostModel`
prices such a pass from the cost model it wraps, so a held-out set is planned and
scheduled for what it runs, not as training passes:

- time: the forward's share of the pass's compute (:data:`FORWARD_SHARE`: a backward
  costs twice its forward, the convention the analytic model counts FLOPs with) plus
  half its communication (the backward mirrors every all-to-all of the forward);
  nothing recomputed. For a fitted model that does not tell communication apart from
  compute (``comm_s`` 0) this is the same third of the whole pass. Approximate: a
  measured forward may take a little more than a third (fewer fused kernels);
- memory: the pass with every block recomputed, which keeps only each block's input
  for a backward besides the model states, an upper bound on a pass that keeps none;
  the model states (weights, gradients, optimizer) stay resident during a run's
  validation and are counted.

Every recomputation setting prices the same (a no-grad forward recomputes nothing), so
the planner's options for a bucket differ only by SP size and micro-batch size.

**Its floor** (:meth:`ForwardOnlyCostModel.pass_floor`, what the proved bound reads),
defined only when the wrapped model has one: seconds, a third of the wrapped model's
floor without recomputation (a forward-only pass takes ``compute / 3 + comm / 2 >=
(compute + comm) / 3`` of that pass, which is never below its floor); bytes, the
lesser of the wrapped floors without and with every block recomputed (the pass's
memory is the lesser of those two passes'). Both keep the wrapped floor's promises
(``tests/pure/planning/test_floor_contract.py`` checks every cost model's).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from datacentric.planning.cost_model import (
    PassBreakdown,
    WrappedCostModel,
    split_breakdown,
    supports_split,
)
from datacentric.shapes import SampleShape

#: The forward's share of a pass's compute (backward = 2 x forward).
FORWARD_SHARE = 1.0 / 3.0


class ForwardOnlyCostModel(WrappedCostModel):
    """``cost_model``'s prices for forward-only passes (see the module doc)."""

    def recompute_key(self, recompute: Sequence[bool]) -> Hashable:
        """No recomputation in a forward-only pass: every setting is one price."""
        return ()

    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        return self._forward(shapes, sp_size, 1)

    def compute_split_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> PassBreakdown:
        return self._forward(shapes, sp_size, ring_size)

    def supports_split(self, sp_size: int, ring_size: int) -> bool:
        """The wrapped model's answer."""
        return supports_split(self.inner, sp_size, ring_size)

    @property
    def pass_floor(self) -> Callable[..., tuple[float, float]]:
        """The floor of a forward-only pass (see the module doc); ``AttributeError``
        when the wrapped model offers none."""
        inner = getattr(self.inner, "pass_floor", None)
        if inner is None:
            raise AttributeError(f"{type(self.inner).__name__} offers no pass_floor")
        blocks = self.inner.num_blocks

        def floor(
            shapes: Sequence[SampleShape],
            sp_size: int,
            recompute: Sequence[bool],  # noqa: ARG001 - a forward recomputes nothing
            **split: Any,
        ) -> tuple[float, float]:
            plain_s, plain_b = inner(shapes, sp_size, (False,) * blocks, **split)
            _, kept_b = inner(shapes, sp_size, (True,) * blocks, **split)
            return plain_s * FORWARD_SHARE, min(plain_b, kept_b)

        return floor

    def _forward(self, shapes: tuple[SampleShape, ...], sp_size: int, ring: int) -> PassBreakdown:
        blocks = self.inner.num_blocks
        plain = split_breakdown(self.inner, shapes, sp_size, (False,) * blocks, ring)
        kept = split_breakdown(self.inner, shapes, sp_size, (True,) * blocks, ring)
        compute = plain.compute_s * FORWARD_SHARE
        comm = plain.comm_s / 2.0
        return PassBreakdown(
            time_s=compute + comm,
            compute_s=compute,
            recompute_s=0.0,
            comm_s=comm,
            memory_bytes=min(plain.memory_bytes, kept.memory_bytes),
        )
