"""A hand-built schedule and a per-token cost model with exact numbers, for the tests of
the simulator and of the timing record (no hardware behind it)."""

from __future__ import annotations

from datacentric.planning.cost_model import CachedCostModel, PassBreakdown
from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule, uniform_iteration
from datacentric.shapes import SampleShape


class ToyCostModel(CachedCostModel):
    """1 ms per token spread over the group, 0.1 s all-to-all when sp > 1, 10 ms per
    recomputed block; memory 100 B per token on a rank; 0.5 s exposed gradient sync."""

    num_blocks = 2
    gpus_per_node = 2

    def __init__(self) -> None:
        self.calls = 0

    def compute_breakdown(self, shapes, sp_size, key) -> PassBreakdown:
        self.calls += 1
        tokens = sum(s.tokens for s in shapes)
        compute, comm, recompute = (
            tokens / (1000 * sp_size),
            (0.1 if sp_size > 1 else 0),
            0.01 * sum(key),
        )
        return PassBreakdown(
            time_s=compute + comm + recompute,
            compute_s=compute,
            recompute_s=recompute,
            comm_s=comm,
            memory_bytes=100 * tokens // sp_size,
        )

    def grad_sync_time_s(self, world_size: int) -> float:
        return 0.5 if world_size > 1 else 0.0


SHAPES = [SampleShape.text(n) for n in (2000, 500, 300, 200, 1000, 1000)]


def micro_batch(ids, rc=(), est=99.0):
    # est_time_s and tokens are deliberately wrong: the engine must re-derive them.
    return MicroBatch(sample_ids=ids, bucket="b", tokens=1, recompute=rc, est_time_s=est)


def toy_schedule() -> Schedule:
    it0 = Iteration(
        index=0,
        assignments=(
            Assignment(rank_start=0, sp_size=2, micro_batches=(micro_batch((0,)),)),
            Assignment(
                rank_start=2, sp_size=1, micro_batches=(micro_batch((1,)), micro_batch((2,)))
            ),
            Assignment(rank_start=3, sp_size=1, micro_batches=(micro_batch((3,)),)),
        ),
    )
    it1 = uniform_iteration(1, 4, 4, [[micro_batch((4, 5), (True, True))]])
    return Schedule(
        world_size=4,
        policy="toy",
        seed=0,
        epoch=0,
        num_samples=6,
        iterations=(it0, it1),
        memory_cap_bytes=10**6,
    )
