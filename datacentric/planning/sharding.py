"""How model state is held across the world: the one ``shard`` setting.

``train``, the :class:`~datacentric.train.data_centric.DataCentric` API, the
planner's memory model (:class:`~datacentric.planning.analytic.AnalyticCostModel`)
and the simulator all read a :class:`ShardingSpec`, so a plan describes the run
``train`` executes:

- ``none``: a plain module; after a rank's last micro-batch one bucketed gradient
  all-reduce (not overlapped). Every rank holds all parameters, gradients and
  optimizer state.
- ``ddp``: ``DistributedDataParallel``; its bucketed all-reduce runs only in the
  rank's last backward (``no_sync`` before), overlapped with it. Memory as ``none``.
- ``fsdp2``: ``fully_shard`` per block; parameters are all-gathered in a rank's first
  forward of a step and stay gathered until its last backward, which reduce-scatters
  (overlapped with it). Optimizer state and the parameters between steps are
  sharded over the world; within a step the gathered parameters and the unsharded
  gradients they accumulate are whole (ranks run different numbers of micro-batches,
  so a collective per pass would deadlock: see ``parallel.grad_sync``).
  ``reshard_after_forward`` frees gathered parameters after every forward and
  gathers them again for backward (parameters sharded within the step too); that
  issues collectives on every pass, so it needs every rank to run the same number
  of micro-batches per step.

The default is ``fsdp2`` (see :data:`DEFAULT_SHARD`); with one rank every setting
is ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass

from datacentric.settings.sections import DEFAULT_SHARD, SHARD_MODES, check_shard

__all__ = ["DEFAULT_SHARD", "SHARD_MODES", "ShardingSpec"]


@dataclass(frozen=True)
class ShardingSpec:
    """The ``shard`` setting: ``mode`` (``none``, ``ddp``, ``fsdp2``) and, for FSDP2,
    ``reshard_after_forward``."""

    mode: str = DEFAULT_SHARD
    reshard_after_forward: bool = False

    def __post_init__(self) -> None:
        check_shard(self.mode, self.reshard_after_forward)

    def effective(self, world_size: int) -> ShardingSpec:
        """The setting as it runs on ``world_size`` ranks (one rank: ``none``)."""
        return self if world_size > 1 else ShardingSpec("none")

    def state_divisors(self, world_size: int) -> tuple[int, int, int]:
        """Ranks that parameters, gradients and optimizer state are split over, at a
        rank's peak within a step (``(1, 1, 1)``: replicated)."""
        spec = self.effective(world_size)
        if spec.mode != "fsdp2":
            return (1, 1, 1)
        return (world_size if spec.reshard_after_forward else 1, 1, world_size)

    def model_state_bytes(
        self,
        num_params: int,
        world_size: int,
        *,
        param_bytes: int,
        grad_bytes: int,
        optimizer_bytes: int,
        trainable_params: int | None = None,
    ) -> int:
        """Bytes of parameters, gradients and optimizer state one rank holds at its peak
        within a step. FSDP2 also keeps its sharded parameters and, after the
        reduce-scatter, sharded gradients beside the whole ones (``1/world`` each).
        Gradients and optimizer state exist for ``trainable_params`` only (default: all;
        frozen weights, as under LoRA, hold neither)."""
        trained = num_params if trainable_params is None else min(trainable_params, num_params)
        params, grads, optim = self.state_divisors(world_size)
        total = num_params * param_bytes / params
        total += trained * (grad_bytes / grads + optimizer_bytes / optim)
        if self.effective(world_size).mode == "fsdp2" and params == 1:
            total += (num_params * param_bytes + trained * grad_bytes) / world_size
        return int(total)

    def overlaps_reduction(self, world_size: int) -> bool:
        """Whether the gradient reduction runs inside the last backward (DDP, FSDP2)
        rather than after it (``none``)."""
        return self.effective(world_size).mode != "none"

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "reshard_after_forward": self.reshard_after_forward}
