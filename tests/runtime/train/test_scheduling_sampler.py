"""The per-rank batch sampler: coverage, DataLoader workers, resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from toy_cost_model import ToyCostModel, toy_pipeline

from datacentric.shapes import SampleShape
from datacentric.train.sampler import RankBatchSampler

MODEL = ToyCostModel(capacity_bytes=16 * 2**20)


class IdDataset(Dataset):
    """Returns each sample's id as a tensor, so batches show what was loaded."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def _schedule(world: int = 4, policy: str = "dcp-opt"):
    lengths = [300 + 997 * i % 50_000 for i in range(120)] + [400_000, 350_000]
    shapes = [SampleShape.text(n) for n in lengths]
    return toy_pipeline(shapes, MODEL, world_size=world, policy=policy, seed=5).schedule(
        measure=False
    )


def test_every_rank_runs_its_group_and_groups_cover_samples_once():
    schedule = _schedule(world=4)
    seen: list[int] = []
    for rank in range(4):
        sampler = RankBatchSampler(schedule, rank)
        infos = list(sampler.micro_batches())
        assert [list(m.sample_ids) for m in infos] == list(sampler)
        assert len(sampler) == len(infos)
        for info in infos:
            mine = schedule.iterations[info.iteration].micro_batches_of_rank(rank)
            group = mine[info.micro_step][0]
            assert (info.rank_start, info.sp_size) == (group.rank_start, group.sp_size)
            assert info.sp_rank == rank - group.rank_start
            assert len(info.recompute) == MODEL.num_blocks
            if info.sp_rank == 0:  # one rank per group stands for the group
                seen += info.sample_ids
        last = [m for m in infos if m.is_last_micro_step]
        assert len(last) == len(schedule.iterations)  # one optimizer step per iteration
    assert sorted(seen) == list(range(schedule.num_samples))


def test_loss_denominators_sum_to_the_global_batch():
    schedule = _schedule(world=2)
    for rank in range(2):
        for info in RankBatchSampler(schedule, rank).micro_batches():
            it = schedule.iterations[info.iteration]
            assert info.iteration_samples == len(it.sample_ids())
            assert info.iteration_tokens == it.num_tokens


def test_dataloader_with_workers_and_resume():
    schedule = _schedule(world=2, policy="dcp-pac")
    sampler = RankBatchSampler(schedule, rank=1)
    expected = list(sampler)
    loader = DataLoader(IdDataset(), batch_sampler=sampler, num_workers=2)
    assert [batch.tolist() for batch in loader] == expected

    cut = len(schedule.iterations) // 2
    state = sampler.state_dict(next_iteration=cut)
    resumed = RankBatchSampler(schedule, rank=1)
    resumed.load_state_dict(state)
    tail = [m for m in sampler.micro_batches() if m.iteration >= cut]
    assert list(resumed) == [list(m.sample_ids) for m in tail]

    other = _schedule(world=2, policy="dcp-opt")
    with pytest.raises(ValueError, match="different schedule"):
        RankBatchSampler(other, rank=1).load_state_dict(state)
    with pytest.raises(ValueError, match="rank 2"):
        RankBatchSampler(schedule, rank=2)
