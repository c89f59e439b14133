"""The global batch covers the world's groups: the batch the library sizes gives every
step, in every data order, one sample for each group of at most the model's largest SP
size; a user's batch that would leave a step short is refused naming the fix."""

from __future__ import annotations

import numpy as np
import pytest

from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import (
    check_global_batch,
    covering_samples,
    covering_tokens,
    epoch_batches,
    samples_per_step,
    size_global_batch,
)
from datacentric.settings import load_config
from datacentric.shapes import SampleShape


def _shapes(tokens: list[int]) -> list[SampleShape]:
    return [SampleShape.text(t) for t in tokens]


def _fewest(lengths: list[int], epochs: int, drop: bool = False, **bound) -> int:
    """The fewest samples of any step over ``epochs`` epochs of the sampler."""
    view = DatasetView(_shapes(lengths))
    fewest = len(lengths)
    for epoch in range(epochs):
        batches, _ = epoch_batches(
            view,
            np.arange(len(lengths)),
            seed=epoch,
            epoch=epoch,
            tokens_bound=bound.get("tokens"),
            samples_bound=bound.get("samples"),
            world_size=4,
            drop_remainder=drop,
        )
        fewest = min(fewest, *(len(b) for b in batches))
    return fewest


@pytest.mark.parametrize("drop", [False, True])
def test_the_covering_bound_gives_every_step_enough_samples_in_any_order(drop):
    rng = np.random.default_rng(0)
    for _ in range(60):
        count, needed = int(rng.integers(2, 41)), int(rng.integers(1, 5))
        if count < needed:
            continue
        tokens = [int(t) for t in rng.integers(1, 400, size=count)]
        bound = covering_tokens(tokens, needed, drop)
        assert bound >= max(tokens)
        assert _fewest(tokens, 6, drop, tokens=bound) >= needed, (tokens, needed, bound)


def test_the_covering_sample_count_is_the_smallest_that_covers():
    for count in range(1, 41):
        for needed in range(1, 5):
            if count < needed:
                continue
            bound = covering_samples(count, needed)
            assert _fewest([10] * count, 1, samples=bound) >= needed
            if bound > 1:
                assert _fewest([10] * count, 1, samples=bound - 1) < needed


def test_the_library_sizes_a_batch_that_covers_the_groups_and_says_why():
    """The issue's case: 13 latents on a 2-head model at world 4 (groups of at most 2
    ranks: 2 samples a step); the data-sized batch (60 tokens) left a step of one."""
    tokens = [12, 24, 60, 12, 24, 12, 20, 8, 30, 36, 12, 24, 10]
    scheduling = load_config(None).scheduling
    old = size_global_batch(scheduling, tokens)  # one rank: the samples decide alone
    assert old.tokens == max(tokens)
    batch = size_global_batch(scheduling, tokens, world_size=4, largest_sp=2)
    assert samples_per_step(4, 2) == 2 and batch.tokens == covering_tokens(tokens, 2)
    assert "every step holds 2 samples" in batch.note and "at most 2" in batch.note
    assert f"the longest sample ({max(tokens)} tokens)" in batch.note
    check_global_batch(
        batch.applied(scheduling), _shapes(tokens), world_size=4, largest_sp=2, seed=0, epochs=50
    )
    with pytest.raises(ValueError, match="needs 2: give more samples"):
        size_global_batch(scheduling, [5], world_size=4, largest_sp=2)


def test_a_users_batch_that_leaves_a_step_short_is_refused_naming_the_fix():
    tokens = [12, 24, 60, 12, 24, 12, 20, 8, 30, 36, 12, 24, 10]
    shapes, fix = _shapes(tokens), covering_tokens(tokens, 2)
    check = dict(world_size=4, largest_sp=2, seed=0, epochs=3)
    with pytest.raises(ValueError, match="smaller than the longest sample .60 tokens.; give at"):
        check_global_batch(load_config(None, global_batch_tokens=59).scheduling, shapes, **check)
    with pytest.raises(ValueError, match=f"need 2 a step; give --global-batch-tokens {fix} or"):
        check_global_batch(load_config(None, global_batch_tokens=60).scheduling, shapes, **check)
    for samples in (1, 2):  # 2 a step, in 7 steps of 13 samples: a step of one
        with pytest.raises(ValueError, match="give --global-batch-samples 3 or more"):
            given = load_config(None, global_batch_samples=samples).scheduling
            check_global_batch(given, shapes, **check)
    check_global_batch(load_config(None, global_batch_samples=3).scheduling, shapes, **check)
    check_global_batch(load_config(None, global_batch_tokens=fix).scheduling, shapes, **check)
    # a world of one group needs one sample a step: the longest sample is the only limit
    check_global_batch(
        load_config(None, global_batch_tokens=60).scheduling, shapes, **{**check, "world_size": 2}
    )


@pytest.mark.parametrize("policy", ["dcp-intra", "dcp-inter", "dcp-pac"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_step_packed_into_fewer_micro_batches_than_groups_is_split_to_cover_them(policy, world):
    """A model that runs on one rank a sample (no SP size above 1), under a memory
    budget that holds a whole step in one micro-batch: the policies that pack a bucket
    at its largest micro-batch gave a step of ``world`` samples one or two micro-batches,
    and the step stopped the run inside its ranks ('a global batch of 1 micro-batch
    cannot cover 2 ranks'); it is split to a micro-batch a rank."""
    from toy_cost_model import ToyCostModel, toy_pipeline

    from datacentric.settings import SchedulingConfig

    options = SchedulingConfig(global_batch_samples=world)
    shapes = _shapes([200 + 7 * i for i in range(12)])
    pipeline = toy_pipeline(
        shapes,
        ToyCostModel(capacity_bytes=2**34),
        world_size=world,
        policy=policy,
        sp_sizes=[1],
        options=options,
    )
    schedule = pipeline.schedule()
    assert len(schedule.iterations) == -(-len(shapes) // world)
    for iteration in schedule.iterations:
        ranks = {a.rank_start for a in iteration.assignments}
        assert ranks == set(range(world)), (iteration.assignments, world)
        assert {a.sp_size for a in iteration.assignments} == {1}


@pytest.mark.parametrize("policy", ["megatron-dyncp", "dcp-intra"])
def test_one_step_of_ten_samples_covers_8_ranks_of_a_model_without_sp(policy):
    """10 samples in one global batch at world 8, SP 1 only: megatron-dyncp formed one
    micro-batch and refused every cap ('megatron-dyncp: no searched cap and recomputation
    runs (... a global batch of 1 micro-batch cannot cover 8 ranks ...)'), dcp-intra two."""
    from toy_cost_model import ToyCostModel, toy_pipeline

    from datacentric.settings import SchedulingConfig

    lengths = [319, 341, 89, 314, 392, 182, 81, 289, 111, 344]
    schedule = toy_pipeline(
        _shapes(lengths),
        ToyCostModel(capacity_bytes=32 * 2**20),
        world_size=8,
        policy=policy,
        sp_sizes=[1],
        options=SchedulingConfig(global_batch_tokens=sum(lengths)),
    ).schedule()
    (iteration,) = schedule.iterations
    assert {a.rank_start for a in iteration.assignments} == set(range(8))
    assert sorted(iteration.sample_ids()) == list(range(10))


def test_the_held_out_pass_takes_a_batch_that_covers_its_samples():
    """A held-out set's pass is cut by the run's global batch raised to cover it: a
    held-out sample of 3,000 tokens under a batch of 35 sized from the training set (the
    run was refused), and groups of one rank at world 4 (every step 4 samples); a batch
    that covers them already is kept, and no remainder is dropped."""
    from datacentric.scheduling.global_batches import held_out_batch
    from datacentric.settings import SchedulingConfig

    lengths = [3000, 30, 31, 32, 33, 34, 35, 36, 37]
    sized = SchedulingConfig(global_batch_tokens=35, drop_remainder=True)
    options = held_out_batch(sized, lengths, world_size=1, largest_sp=1)
    assert options.global_batch_tokens == 3000 and options.tokens_per_iteration == 3000
    assert not options.drop_remainder
    check_global_batch(options, _shapes(lengths), world_size=1, largest_sp=1, seed=0, epochs=1)
    wide = held_out_batch(sized, lengths, world_size=4, largest_sp=1)
    assert wide.global_batch_tokens == covering_tokens(lengths, 4)
    assert _fewest(lengths, 5, tokens=wide.global_batch_tokens) >= 4
    kept = SchedulingConfig(global_batch_tokens=10**6)
    assert held_out_batch(kept, lengths, world_size=4, largest_sp=1).global_batch_tokens == 10**6
    samples = SchedulingConfig(global_batch_samples=2)
    held = held_out_batch(samples, lengths[:8], world_size=4, largest_sp=2)
    assert held.global_batch_samples == 2  # 4 steps of 2
    held = held_out_batch(samples, lengths, world_size=4, largest_sp=2)
    assert held.global_batch_samples == 3  # of 9, steps of 2 leave one of 1
    held = held_out_batch(samples, lengths, world_size=4, largest_sp=1)
    assert held.global_batch_samples == 5  # steps of 5 and 4, 4 a step
    unset = SchedulingConfig()
    assert held_out_batch(unset, lengths, world_size=4, largest_sp=1).global_batch_tokens is None
