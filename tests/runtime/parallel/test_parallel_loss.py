"""Loss weights and sequence sharding (pure, single process)."""

from __future__ import annotations

import pytest
import torch

from datacentric.data import SyntheticTextDataset
from datacentric.parallel.loss import LossWeights, loss_tokens_function
from datacentric.parallel.sequence_shards import shard_batch
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.shapes import SampleShape

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = [5, 3, 8, 1, 4]  # sample 3 has one token, hence no next-token target


@pytest.fixture
def dataset() -> SyntheticTextDataset:
    return SyntheticTextDataset([SampleShape.text(n) for n in LENGTHS], seed=1)


def _iteration() -> Iteration:
    mb = lambda ids: MicroBatch(sample_ids=ids, bucket="t", tokens=sum(LENGTHS[i] for i in ids))
    return Iteration(
        index=0,
        assignments=(
            Assignment(rank_start=0, sp_size=2, micro_batches=(mb((2, 0)),)),
            Assignment(rank_start=2, sp_size=1, micro_batches=(mb((1,)), mb((3, 4)))),
        ),
    )


def test_loss_tokens_counted_from_the_packer(dataset) -> None:
    count = loss_tokens_function(dataset)
    assert [count(i) for i in range(len(LENGTHS))] == [n - 1 for n in LENGTHS]


@pytest.mark.parametrize("mode", ["token", "sample"])
def test_weights_over_all_shards_and_micro_batches_give_the_global_mean(dataset, mode) -> None:
    weights = LossWeights.for_iteration(mode, _iteration(), loss_tokens_function(dataset))
    assert weights.total_loss_tokens == sum(n - 1 for n in LENGTHS)
    assert weights.num_loss_samples == 4  # sample 3 carries no loss
    gen = torch.Generator().manual_seed(0)
    per_sample_loss = {}
    total = torch.zeros((), dtype=torch.float64)
    for assignment in _iteration().assignments:
        for mb in assignment.micro_batches:
            full = dataset.pack(mb.sample_ids, assignment.sp_size)
            weights.check_batch(full)
            loss_S = torch.rand(full.num_tokens, generator=gen, dtype=torch.float64)
            loss_S[~full.loss_mask] = float("nan")  # masked tokens must not leak
            for k, sample in enumerate(full.sample_ids):
                picked = loss_S[(full.segment_ids == k) & full.loss_mask]
                per_sample_loss[sample] = picked
            for rank in range(assignment.sp_size):
                shard = shard_batch(full, rank, assignment.sp_size)
                lo = shard.token_offset
                total += weights.weighted_sum(loss_S[lo : lo + shard.num_tokens], shard)
    if mode == "token":
        expected = torch.cat(list(per_sample_loss.values())).mean()
    else:
        expected = torch.stack([v.mean() for v in per_sample_loss.values() if v.numel()]).mean()
    torch.testing.assert_close(total, expected)


def test_weights_reject_a_wrong_loss_token_count(dataset) -> None:
    weights = LossWeights.for_samples("token", [0, 1], lambda s: LENGTHS[s])  # off by one
    with pytest.raises(ValueError, match="sample 0: the packed batch has 4 loss tokens"):
        weights.check_batch(dataset.pack([0, 1]))
    with pytest.raises(ValueError, match="loss mode"):
        LossWeights(mode="mean", loss_tokens={0: 1})
    with pytest.raises(ValueError, match="no loss-carrying token"):
        LossWeights(mode="token", loss_tokens={3: 0})
    with pytest.raises(ValueError, match="one unreduced loss per local token"):
        weights.weighted_sum(torch.zeros(()), dataset.pack([0]))


def test_shards_are_contiguous_and_keep_the_global_layout(dataset) -> None:
    full = dataset.pack([0, 2, 4], pad_to_multiple=4)
    assert full.num_tokens == 20 and full.full_length == 20
    shards = [shard_batch(full, r, 4) for r in range(4)]
    for name in ("inputs", "targets", "position_ids", "segment_ids", "loss_mask"):
        torch.testing.assert_close(
            torch.cat([getattr(s, name) for s in shards]), getattr(full, name)
        )
    assert [s.token_offset for s in shards] == [0, 5, 10, 15]
    assert all(torch.equal(s.cu_seqlens, full.cu_seqlens) for s in shards)
    assert not shards[-1].loss_mask[-3:].any()  # padding


def test_shard_errors_name_the_problem(dataset) -> None:
    full = dataset.pack([0, 2], pad_to_multiple=1)  # 13 tokens
    with pytest.raises(ValueError, match="13 tokens cannot be split across SP size 2"):
        shard_batch(full, 0, 2)
    with pytest.raises(ValueError, match="rank 2 is outside an SP group of size 2"):
        shard_batch(dataset.pack([0, 2], 2), 2, 2)
    with pytest.raises(ValueError, match="needs a whole micro-batch"):
        shard_batch(full.slice_tokens(0, 5), 0, 1)
