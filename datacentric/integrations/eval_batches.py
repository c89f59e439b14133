"""transformers' ``eval_loss``, weighted token by token over the held-out set.

transformers' evaluation loop reports the mean of its eval batches' losses, each counted
once per row of its batch. On one process the batches are ``per_device_eval_batch_size``
consecutive rows (the last one shorter), and a batch's loss is the model's mean over its
loss tokens. On ``W`` ranks, accelerate shards them (rank ``r`` takes every ``W``-th
batch, the last round filled with rows from the start) and each rank's loss is its
summed loss x ``W`` over the loss tokens of the whole round (transformers counts them
over the ranks: ``average_tokens_across_devices``); the gathered values are cut back to
the set's rows (``gather_for_metrics``), and a round with no loss token (a NaN) is left
out. That is a linear function of the tokens' losses: each loss token of sample ``s``
weighs ``sum over the batches b holding it of (rows b counts for) x W x (times b holds
s) / (all rows counted x loss tokens of b's round)``, so the runtime's held-out pass
computes it exactly with those weights (:class:`BatchMeanWeights`), in its own
micro-batches, on any world.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datacentric.parallel.loss import LossWeights


@dataclass(frozen=True)
class BatchMeanWeights(LossWeights):
    """Loss weights given per sample: the weight of each loss token of a sample."""

    token_weight: Mapping[int, float] = field(default_factory=dict)
    """sample id -> the weight of one of its loss tokens."""

    def sample_weights(self, sample_ids: Sequence[int]) -> list[float]:
        """The weight of one loss token of each sample."""
        return [self.token_weight[int(s)] for s in sample_ids]


def eval_rounds(samples: int, batch: int, world: int) -> list[list[tuple[list[int], int]]]:
    """transformers' eval batches of a set of ``samples`` rows at ``batch`` rows a rank on
    ``world`` ranks, by round (one batch of each rank): ``(rows of the batch, in order and
    with repeats; how many times its loss is counted)``, as its loop gathers them (each
    batch's loss repeated by the rank's batch size, the last round cut to the set's
    remainder)."""
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler = BatchSampler(SequentialSampler(range(samples)), batch, drop_last=False)
    if world == 1:  # accelerate leaves one process's loader unsharded
        return [[(list(rows), len(rows))] for rows in sampler]
    from accelerate.data_loader import BatchSamplerShard

    ranks = [
        list(BatchSamplerShard(sampler, num_processes=world, process_index=r, even_batches=True))
        for r in range(world)
    ]
    rounds = list(zip(*ranks, strict=True))
    out = []
    for index, batches in enumerate(rounds):
        keep = samples % (batch * world) if index == len(rounds) - 1 else 0
        keep = keep or batch * world  # gather_for_metrics cuts the last round only
        kept = []
        for rank, rows in enumerate(batches):
            counted = min(len(ranks[rank][0]), keep)  # the rank's first batch size
            kept.append((list(rows), counted))
            keep -= counted
        out.append(kept)
    return out


def batch_mean_weights(
    loss_tokens: Mapping[int, int], batch: int, world: int, mode: str
) -> BatchMeanWeights:
    """The weights that make the held-out pass over samples ``0..n-1`` (each with
    ``loss_tokens[s]`` loss tokens) give transformers' ``eval_loss``."""
    rounds = []
    for batches in eval_rounds(len(loss_tokens), batch, world):
        tokens = sum(loss_tokens[s] for rows, _ in batches for s in rows)
        if tokens > 0:  # else a NaN, which transformers' filter leaves out
            rounds.append((batches, tokens))
    rows_counted = sum(counted for batches, _ in rounds for _, counted in batches)
    weight = dict.fromkeys(loss_tokens, 0.0)
    for batches, tokens in rounds:
        for rows, counted in batches:
            for s in rows:
                weight[s] += counted * world / (rows_counted * tokens)
    return BatchMeanWeights(mode=mode, loss_tokens=dict(loss_tokens), token_weight=weight)


class TransformersEvalBatches:
    """A held-out set (:class:`~datacentric.train.validation.held_out.HeldOut`) whose loss
    is transformers' ``eval_loss`` at ``batch`` rows a rank on ``world`` ranks: its
    schedule and records, with :func:`batch_mean_weights` for weights."""

    def __init__(self, held_out: Any, batch: int, world: int) -> None:
        self.held_out, self.batch, self.world = held_out, batch, world
        self.dataset = held_out.dataset

    @property
    def schedule(self) -> Any:
        """The held-out set's own schedule."""
        return self.held_out.schedule

    def weights(self, loss_mode: str) -> LossWeights:
        """Each held-out token's weight in transformers' ``eval_loss``."""
        every = self.held_out.weights(loss_mode).loss_tokens
        return batch_mean_weights(every, self.batch, self.world, loss_mode)
