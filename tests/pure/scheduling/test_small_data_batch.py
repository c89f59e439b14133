"""A small dataset's default global batch is sized from its samples (not the world)."""

from __future__ import annotations

import numpy as np

from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import (
    SMALL_DATA_STEPS,
    GlobalBatchSize,
    chunk_even,
    data_sized_tokens,
    epoch_batches,
    size_global_batch,
)
from datacentric.settings import TrainConfig, load_config
from datacentric.shapes import SampleShape


def test_a_small_dataset_gets_several_steps_an_epoch():
    tokens = [40 + (7 * i) % 90 for i in range(60)]
    bound = data_sized_tokens(tokens)
    assert bound == -(-sum(tokens) // SMALL_DATA_STEPS)
    view = DatasetView([SampleShape(tokens=t) for t in tokens])
    active = np.arange(len(tokens))
    orders = []
    for world in (1, 2, 4):  # the sized batch does not depend on the world
        batches, _ = epoch_batches(
            view, active, seed=3, epoch=0, tokens_bound=bound, samples_bound=None, world_size=world
        )
        orders.append([b.tolist() for b in batches])
    assert orders[0] == orders[1] == orders[2]
    assert 4 <= len(orders[0]) <= SMALL_DATA_STEPS
    assert sorted(i for b in orders[0] for i in b) == list(range(60))


def test_large_data_keeps_the_default_and_the_longest_sample_bounds_below():
    assert data_sized_tokens([2**18] * SMALL_DATA_STEPS) is None
    assert data_sized_tokens([2**18] * (SMALL_DATA_STEPS - 1)) == 2**18
    assert data_sized_tokens([10, 10, 1000]) == 1000
    assert data_sized_tokens([]) is None
    assert data_sized_tokens([500]) is None  # one step, as the default


def test_the_global_batch_step_sizes_a_copy_and_keeps_a_given_one():
    tokens = [100] * 60
    config = TrainConfig()
    batch = size_global_batch(config.scheduling, tokens)
    assert batch.tokens == 750
    assert "750 tokens" in batch.note and "8 steps" in batch.note
    sized = batch.applied(config.scheduling)
    assert config.scheduling.global_batch_tokens is None  # the step writes no settings
    assert sized.global_batch_tokens == 750
    for given in ({"global_batch_tokens": 3000}, {"global_batch_samples": 5}):
        config = load_config(None, **given)
        batch = size_global_batch(config.scheduling, tokens)
        assert batch == GlobalBatchSize() and batch.applied(config.scheduling) is config.scheduling


def test_every_epoch_has_the_steps_the_run_plans_when_one_sample_is_a_batch_long():
    """A small dataset whose longest sample sets the sized batch: an epoch whose order puts
    it last cut both batches after it (the first target falls inside it), so that epoch
    trained one step of all 1,318 tokens and the run one step fewer than it planned."""
    tokens = [724, 44, 61, 71, 83, 99, 108, 128]
    bound = data_sized_tokens(tokens)
    assert bound == 724  # the longest sample's
    view = DatasetView([SampleShape(tokens=t) for t in tokens])
    counts = set()
    for epoch in range(20):
        batches, _ = epoch_batches(
            view,
            np.arange(len(tokens)),
            seed=0,
            epoch=epoch,
            tokens_bound=bound,
            samples_bound=None,
            world_size=4,
        )
        counts.add(len(batches))
        assert sorted(i for b in batches for i in b) == list(range(len(tokens)))
    assert counts == {-(-sum(tokens) // bound)}  # 2 steps, every epoch


def test_chunks_are_as_many_as_the_bound_asks_whatever_straddles_a_cut():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        weights = rng.integers(1, 50, size=n)
        weights[rng.integers(n)] = int(rng.integers(50, 400))  # one long sample anywhere
        bound = int(rng.integers(int(weights.max()), int(weights.sum()) + 2))
        for drop in (False, True):
            chunks, dropped = chunk_even(np.arange(n), weights, bound, drop)
            total = int(weights.sum())
            want = total // bound if drop and total >= bound else max(1, -(-total // bound))
            assert len(chunks) == want and all(len(c) for c in chunks), (weights, bound, drop)
            kept = [i for c in chunks for i in c.tolist()]
            assert kept + dropped == list(range(n))


def test_the_note_counts_the_steps_drop_remainder_keeps():
    """With --drop-remainder the note of a sized batch said the steps of the whole epoch
    ('about 2 steps an epoch' of 3 documents, 10, 12 and 24 tokens: sized 24) where the
    run trained 1 and left out a third of its samples without a word; it now counts the
    steps kept and the tokens left out, in every world and order."""
    from datacentric.settings import SchedulingConfig

    cases = ([10, 12, 24], [40 + (7 * i) % 90 for i in range(60)], [300, 20, 20, 20, 20])
    for tokens in cases:
        batch = size_global_batch(SchedulingConfig(drop_remainder=True), tokens, world_size=1)
        view = DatasetView([SampleShape(tokens=t) for t in tokens])
        for seed in range(4):
            batches, _ = epoch_batches(
                view,
                np.arange(len(tokens)),
                seed=seed,
                epoch=0,
                tokens_bound=batch.tokens,
                samples_bound=None,
                world_size=1,
                drop_remainder=True,
            )
            kept = sum(tokens[i] for b in batches for i in b)
            steps = "1 step" if len(batches) == 1 else f"{len(batches)} steps"
            assert f"about {steps} an epoch, --drop-remainder" in batch.note, batch.note
            least = sum(tokens) - len(batches) * batch.tokens
            assert f"leaving out at least {least:,} of its {sum(tokens):,}" in batch.note
            assert sum(tokens) - kept >= least
    kept_all = size_global_batch(SchedulingConfig(), [10, 12, 24])
    assert "about 2 steps an epoch (--global-batch-tokens" in kept_all.note
