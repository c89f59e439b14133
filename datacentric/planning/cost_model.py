"""The cost-model interface shared by the planner, the scheduler and the simulator.

A cost model predicts, for one micro-batch (a list of sample shapes processed in
one forward+backward pass) on an SP group of ``sp_size`` ranks with a given
per-block recomputation setting, the wall time of the pass on each rank of the
group and the peak device memory of each rank. Implementations: the fitted model
(from profiles measured on the real device) and the analytic model (FLOPs and
bytes on a named hardware preset). The scheduler and simulator only use this
protocol, so they never depend on where the numbers come from.

Two optional attributes refine planning when a model has them (both implementations
here do): ``block_kinds`` (a tuple naming each block's kind; the recomputation knapsack
groups blocks by it, one kind otherwise) and ``supports_sp_size(sp) -> bool`` (Ulysses
needs the SP size to divide the heads; the fitted model predicts only measured sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from datacentric.shapes import SampleShape


@runtime_checkable
class CostModel(Protocol):
    """Predicts time and memory of one micro-batch pass."""

    @property
    def num_blocks(self) -> int:
        """Number of repeated transformer blocks (length of a recompute tuple)."""
        ...

    @property
    def memory_capacity_bytes(self) -> int:
        """Usable device memory per rank (the cap plans must fit under)."""
        ...

    @property
    def gpus_per_node(self) -> int:
        """Ranks per node; groups larger than this cross the inter-node network."""
        ...

    def pass_time_s(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> float:
        """Forward + backward seconds of one micro-batch on a group of ``sp_size``
        (compute, recomputation and the group's all-to-all communication)."""
        ...

    def pass_memory_bytes(
        self, shapes: Sequence[SampleShape], sp_size: int, recompute: Sequence[bool]
    ) -> int:
        """Peak bytes on one rank of the group: model states plus activations."""
        ...

    def grad_sync_time_s(self, world_size: int) -> float:
        """Seconds of the once-per-iteration gradient all-reduce over the world
        that is *not* hidden behind backward."""
        ...
