"""A per-rank batch sampler over a Schedule, for ``torch.utils.data.DataLoader``.

Every rank builds the same schedule (no communication) and iterates its own share:
for each iteration, the micro-batches of the group that holds the rank, in order.
Ranks of one SP group get the same sample ids (each loads the micro-batch and keeps
its shard). The sampler yields plain lists of sample ids, so it works as
``DataLoader(dataset, batch_sampler=sampler, num_workers=N)``; the assignment of
each yielded batch (group, SP size, recomputation, accumulation position and the
loss-weight denominators of its global batch) is :meth:`RankBatchSampler.micro_batches`,
in the same order.

Resuming: ``state_dict(next_iteration)`` after an optimizer step records where the
epoch stands as a :class:`~datacentric.scheduling.resume.Position` (the one resume
state of the trainer and ``DataCentric`` too); ``load_state_dict`` continues there.
On another world size, build the continuing schedule with
:func:`~datacentric.scheduling.resume.continue_schedule` and a new sampler at the
position's ``segment_iteration``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Sampler

from datacentric.schedule import Schedule
from datacentric.scheduling.resume import Position, schedule_fingerprint


@dataclass(frozen=True)
class RankMicroBatch:
    """One micro-batch as one rank runs it."""

    iteration: int
    """Index of the iteration (optimizer step) in the epoch."""
    micro_step: int
    """Position in the rank's accumulation list of the step, over its phases (0-based)."""
    num_micro_steps: int
    """The rank's accumulation count; the optimizer steps after the last one."""
    rank_start: int
    """First rank of the SP group."""
    sp_size: int
    """Ranks in the SP group."""
    sp_rank: int
    """This rank's position in its group (which shard of the sequence it holds)."""
    sample_ids: tuple[int, ...]
    """Dataset ids of the micro-batch's samples (packed in this order)."""
    bucket: str
    """Bucket name (the longest sample's, for a packed mix)."""
    tokens: int
    """Tokens of the whole micro-batch (all shards)."""
    recompute: tuple[bool, ...]
    """Per block: recompute activations in backward."""
    est_time_s: float
    """The cost model's estimate of the pass."""
    iteration_samples: int
    """Samples in the iteration's global batch (per-sample loss denominator)."""
    iteration_tokens: int
    """Tokens in the iteration's global batch (per-token loss denominator when every
    token carries loss; otherwise sum the dataset's loss tokens over the batch)."""

    @property
    def is_last_micro_step(self) -> bool:
        """The optimizer steps after this micro-batch."""
        return self.micro_step == self.num_micro_steps - 1


def rank_micro_batches(
    schedule: Schedule, rank: int, start_iteration: int = 0
) -> Iterator[RankMicroBatch]:
    """The micro-batches ``rank`` runs, from ``start_iteration`` to the epoch's end."""
    if not 0 <= rank < schedule.world_size:
        raise ValueError(f"rank {rank} is outside 0..{schedule.world_size - 1}")
    for it in schedule.iterations[start_iteration:]:
        mine = it.micro_batches_of_rank(rank)
        samples = sum(len(mb.sample_ids) for a in it.assignments for mb in a.micro_batches)
        tokens = it.num_tokens
        for k, (group, mb) in enumerate(mine):
            yield RankMicroBatch(
                iteration=it.index,
                micro_step=k,
                num_micro_steps=len(mine),
                rank_start=group.rank_start,
                sp_size=group.sp_size,
                sp_rank=rank - group.rank_start,
                sample_ids=mb.sample_ids,
                bucket=mb.bucket,
                tokens=mb.tokens,
                recompute=mb.recompute,
                est_time_s=mb.est_time_s,
                iteration_samples=samples,
                iteration_tokens=tokens,
            )


class RankBatchSampler(Sampler[list[int]]):
    """Yields ``rank``'s micro-batches of ``schedule`` as lists of sample ids."""

    def __init__(self, schedule: Schedule, rank: int, *, start_iteration: int = 0) -> None:
        if not 0 <= rank < schedule.world_size:
            raise ValueError(f"rank {rank} is outside 0..{schedule.world_size - 1}")
        self.schedule = schedule
        self.rank = rank
        self.start_iteration = 0
        self._fingerprint = schedule_fingerprint(schedule)
        self._seek(start_iteration)

    def _seek(self, iteration: int) -> None:
        if not 0 <= iteration <= len(self.schedule.iterations):
            raise ValueError(f"iteration {iteration} is outside 0..{len(self.schedule.iterations)}")
        self.start_iteration = iteration

    def __iter__(self) -> Iterator[list[int]]:
        for mb in rank_micro_batches(self.schedule, self.rank, self.start_iteration):
            yield list(mb.sample_ids)

    def __len__(self) -> int:
        return sum(
            len(it.micro_batches_of_rank(self.rank))
            for it in self.schedule.iterations[self.start_iteration :]
        )

    def micro_batches(self) -> Iterator[RankMicroBatch]:
        """The assignment of every batch :meth:`__iter__` yields, in the same order."""
        return rank_micro_batches(self.schedule, self.rank, self.start_iteration)

    def state_dict(self, next_iteration: int) -> dict[str, Any]:
        """The :class:`Position` (as JSON) once iterations before ``next_iteration`` ran."""
        return Position.at(self.schedule, next_iteration).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where a saved :class:`Position` stands; it must be of this schedule."""
        position = Position.from_json(state)
        if position.segment_fingerprint != self._fingerprint:
            raise ValueError(
                "the saved position belongs to a different schedule (dataset, world, "
                "policy, seed, epoch or options changed); rebuild it with continue_schedule"
            )
        self._seek(position.segment_iteration)
