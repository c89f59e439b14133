"""One global batch for every policy: the shared data order, equal tokens per step,
the baselines and the Megatron dynamic-CP port."""

from __future__ import annotations

import numpy as np
import pytest
from toy_cost_model import ToyCostModel, toy_pipeline

from datacentric.scheduling import POLICIES
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import epoch_batches, order_change
from datacentric.scheduling.megatron_groups import megatron_micro_batches
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape

MODEL = ToyCostModel(capacity_bytes=16 * 2**20)
LENGTHS = [300 + 997 * i % 40_000 for i in range(150)] + [150_000, 120_000]
SHAPES = [SampleShape.text(n) for n in LENGTHS]
BATCH = 400_000


def test_every_policy_runs_the_same_samples_per_step_whatever_the_world():
    options = SchedulingConfig(global_batch_tokens=BATCH)
    steps = None
    for world in (2, 4, 8):
        for policy in POLICIES:
            schedule = toy_pipeline(
                SHAPES, MODEL, world_size=world, policy=policy, seed=1, options=options
            ).schedule()
            ids = [sorted(it.sample_ids()) for it in schedule.iterations]
            steps = steps or ids
            assert ids == steps, (policy, world)
            mean = schedule.meta["tokens_per_step_mean"]
            assert mean == pytest.approx(sum(LENGTHS) / len(steps), rel=0.05)
            assert schedule.meta["tokens_per_step_max"] <= 1.05 * mean


def test_reorder_window_keeps_step_sizes_and_moves_samples_within_windows():
    view = DatasetView(SHAPES)
    active = np.arange(len(SHAPES))
    common = dict(seed=0, epoch=0, tokens_bound=BATCH, samples_bound=None, world_size=4)
    plain, _ = epoch_batches(view, active, **common)
    moved, _ = epoch_batches(view, active, reorder_window=2, **common)
    assert [len(c) for c in moved] == [len(c) for c in plain]
    for k in range(0, len(plain), 2):
        assert sorted(np.concatenate(plain[k : k + 2])) == sorted(np.concatenate(moved[k : k + 2]))
    assert any(set(a) != set(b) for a, b in zip(plain, moved))
    change = order_change(plain, moved)
    assert 0 < change["moved_share"] <= 1 and change["max_shift"] == 1
    assert change["mean_shift"] == pytest.approx(change["moved_share"])
    assert order_change(plain, plain) == {"moved_share": 0.0, "mean_shift": 0.0, "max_shift": 0}
    with pytest.raises(ValueError, match="different samples"):
        order_change(plain, moved[1:])


def test_megatron_port_reproduces_the_documented_example():
    lengths = [3000, 1800, 900, 700, 600, 500, 400, 300, 200, 100, 100, 50]
    mbs = megatron_micro_batches(list(enumerate(lengths)), cap=1000, ranks=8)
    first = {(g.size, tuple(sorted(g.ids))) for g in mbs[0]}
    assert first == {(4, (0, 4, 6)), (2, (1, 8)), (1, (2, 9)), (1, (3, 7))}
    assert {(g.size, tuple(sorted(g.ids))) for g in mbs[1]} == {(4, (5,)), (4, (10, 11))}


def test_megatron_port_runs_each_of_its_micro_batches_as_one_phase(monkeypatch):
    from datacentric.scheduling import megatron_steps

    formed = {}

    def record(lengths, *args):
        formed[frozenset(i for i, _ in lengths)] = real(lengths, *args)
        return formed[frozenset(i for i, _ in lengths)]

    real = megatron_steps.megatron_micro_batches  # the forming each step calls
    monkeypatch.setattr(megatron_steps, "megatron_micro_batches", record)
    options = SchedulingConfig(global_batch_tokens=BATCH, megatron_tokens_per_rank=20_000)
    schedule = toy_pipeline(
        SHAPES, MODEL, world_size=8, policy="megatron-dyncp", options=options
    ).schedule()
    # each step's forming, found by its samples (one cap: formed once per step)
    steps = [formed[frozenset(it.sample_ids())] for it in schedule.iterations]
    assert any(len(micro_batches) > 1 for micro_batches in steps)
    for it, micro_batches in zip(schedule.iterations, steps):
        assert it.num_phases == len(micro_batches)
        for phase, groups in enumerate(micro_batches):
            ran = [a for a in it.assignments if a.phase == phase]
            assert sorted((a.rank_start, a.sp_size, sorted(a.sample_ids())) for a in ran) == sorted(
                (g.first, g.size, sorted(g.ids)) for g in groups
            )


def test_megatron_fill_step_on_a_world_that_is_not_a_power_of_two():
    mbs = megatron_micro_batches([(0, 4000), (1, 4000)], cap=1000, ranks=10)
    for groups in mbs:
        assert sum(g.size for g in groups) == 10
        assert all(g.first % g.size == 0 for g in groups)


def test_global_batch_smaller_than_the_longest_sample_fails_fast():
    options = SchedulingConfig(global_batch_tokens=1)
    with pytest.raises(ValueError, match="smaller than the longest sample"):
        toy_pipeline(SHAPES, MODEL, world_size=4, policy="static", options=options).schedule()


def test_max_sp_is_honoured_when_a_step_is_too_small_for_the_world():
    options = SchedulingConfig(global_batch_samples=2, max_sp_size=2)
    with pytest.raises(ValueError, match="cannot cover 8 ranks"):
        toy_pipeline(SHAPES[:4], MODEL, world_size=8, policy="dcp-opt", options=options).schedule()


@pytest.mark.parametrize("bad", ["0", "-5", "4 0 16"])
def test_lengths_file_names_the_line_of_a_bad_size(tmp_path, bad):
    from datacentric.shapes import read_lengths_file

    path = tmp_path / "lengths.txt"
    path.write_text(f"100\n{bad}\n")
    with pytest.raises(ValueError, match="line 2"):
        read_lengths_file(str(path))
