"""A tiny cost model for tests and examples of the scheduler (no hardware behind it).

Time: a fixed launch cost, linear and quadratic (attention) work split over the SP
group, an all-to-all term that grows past a node, and recomputation re-running the
forward (a third of the pass) of the blocks that recompute. Memory: fixed model
states plus per-token activations of every block, a recomputing block keeping an
eighth of them. It satisfies the :class:`~datacentric.planning.cost_model.CostModel`
protocol, and its numbers are only meant to be plausible in shape.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from datacentric.planning.cost_model import CachedCostModel, PassBreakdown
from datacentric.scheduling.pipeline import Pipeline
from datacentric.shapes import SampleShape


@dataclass(frozen=True)
class ToyCostModel(CachedCostModel):
    """A plausible-in-shape cost model (see module doc)."""

    blocks: int = 4
    capacity_bytes: int = 64 * 2**20
    """The budget the tests plan under (the model itself holds none)."""
    node_size: int = 8
    launch_s: float = 2e-3
    per_token_s: float = 1e-6
    per_token_sq_s: float = 2e-10
    comm_per_token_s: float = 2e-7
    state_bytes: int = 8 * 2**20
    act_bytes_per_token_block: int = 64
    sync_s: float = 1e-3

    @property
    def num_blocks(self) -> int:
        return self.blocks

    @property
    def gpus_per_node(self) -> int:
        return self.node_size

    def compute_breakdown(
        self, shapes: tuple[SampleShape, ...], sp_size: int, key: Hashable
    ) -> PassBreakdown:
        recompute: tuple[bool, ...] = key  # type: ignore[assignment]
        n = sum(s.tokens for s in shapes)
        q = sum(s.tokens * s.tokens for s in shapes)
        compute = (self.per_token_s * n + self.per_token_sq_s * q) / sp_size
        share = sum(recompute) / self.blocks if recompute else 0.0
        comm = 0.0
        if sp_size > 1:
            slow = 4.0 if sp_size > self.node_size else 1.0
            comm = self.comm_per_token_s * n * slow * (sp_size - 1) / sp_size
        per_rank = math.ceil(n / sp_size)
        flags = list(recompute) or [False] * self.blocks
        kept = sum(0.125 if r else 1.0 for r in flags)
        return PassBreakdown(
            time_s=self.launch_s + compute * (1.0 + share / 3.0) + comm,
            compute_s=self.launch_s + compute,
            recompute_s=compute * share / 3.0,
            comm_s=comm,
            memory_bytes=int(self.state_bytes + per_rank * self.act_bytes_per_token_block * kept),
        )

    def grad_sync_time_s(self, world_size: int) -> float:
        return self.sync_s * math.log2(world_size) if world_size > 1 else 0.0


def toy_pipeline(shapes, cost_model: ToyCostModel, *, world_size: int, **settings) -> Pipeline:
    """A :class:`~datacentric.scheduling.pipeline.Pipeline` under the toy's budget
    (``capacity_bytes``); ``settings``: the pipeline's other arguments."""
    return Pipeline(
        shapes,
        cost_model,
        world_size=world_size,
        memory_cap_bytes=cost_model.capacity_bytes,
        **settings,
    )


def mixed_text(n: int = 400, seed: int = 0) -> list[SampleShape]:
    """``n`` short texts (64-8,000 tokens, log-uniform) and one in 40 long (150K-700K),
    shuffled: a long-tailed mix for the policies."""
    rng = np.random.default_rng(seed)
    short = np.exp(rng.uniform(np.log(64), np.log(8000), n)).astype(int)
    long = rng.integers(150_000, 700_000, max(1, n // 40))
    return [SampleShape.text(int(x)) for x in rng.permutation(np.r_[short, long])]
