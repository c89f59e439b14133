"""A cost model limited to one kind of SP split (pure: no torch).

:class:`SplitLimitedCostModel` answers as the cost model it wraps but prices only the
splits of one mode, so the planner's options, the policies and the simulator see
only those:

- ``ulysses``: Ulysses alone (ring degree 1), as before rings existed;
- ``ring``: a ring over the whole group (ring degree = SP size, context parallelism
  as Megatron-Core's ``p2p`` runs it); no head-count limit;
- ``hybrid``: every split the wrapped model prices (the same as not wrapping).

Benchmarks compare dcp-opt with hybrid groups against the best Ulysses-only plan and
against Megatron's scheduler with ring CP through it.
"""

from __future__ import annotations

from collections.abc import Hashable

from datacentric.planning.cost_model import (
    CostModel,
    PassBreakdown,
    WrappedCostModel,
    split_breakdown,
    supports_split,
)
from datacentric.shapes import SampleShape

SPLIT_MODES = ("ulysses", "ring", "hybrid")


class SplitLimitedCostModel(WrappedCostModel):
    """``cost_model`` priced only on the splits ``mode`` allows (see the module doc).

    On a group of ``sp`` ranks the ``ring`` mode runs every pass on a ring of ``sp``;
    a pass asked without a ring degree on ``sp > 1`` is priced as that ring (the group
    has no other split), so callers that know only SP sizes see ring CP. A pass it
    runs costs what the wrapped model says, so the wrapped model's floor holds
    (asked on the split the pass runs)."""

    same_prices = True

    def __init__(self, cost_model: CostModel, mode: str) -> None:
        if mode not in SPLIT_MODES:
            raise ValueError(f"split mode must be one of {', '.join(SPLIT_MODES)}, got {mode!r}")
        super().__init__(cost_model)
        self.mode = mode

    def supports_split(self, sp_size: int, ring_size: int) -> bool:
        """The wrapped model's answer, limited to this mode's splits."""
        if self.mode == "ulysses" and ring_size != 1:
            return False
        if self.mode == "ring" and ring_size != sp_size:
            return False
        if sp_size == 1:
            return supports_split(self.inner, 1, 1)
        return supports_split(self.inner, sp_size, ring_size)

    def supports_sp_size(self, sp_size: int) -> bool:
        """Whether some split of this mode runs ``sp_size`` ranks."""
        rings = [r for r in range(1, sp_size + 1) if sp_size % r == 0]
        return any(self.supports_split(sp_size, r) for r in rings)

    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        """A pass asked without a ring: Ulysses, or in ``ring`` mode the group's ring."""
        ring = sp_size if self.mode == "ring" else 1
        return self.compute_split_breakdown(shapes, sp_size, ring, key)

    def compute_split_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, ring_size: int, key: Hashable
    ) -> PassBreakdown:
        """The wrapped model's breakdown on a split this mode allows."""
        if not self.supports_split(sp_size, ring_size):
            raise ValueError(
                f"the {self.mode} split mode does not run SP {sp_size} with a ring of {ring_size}"
            )
        return split_breakdown(self.inner, shapes, sp_size, key, ring_size)  # type: ignore[arg-type]
