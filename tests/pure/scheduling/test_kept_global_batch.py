"""A run given no global batch trains the default of the world it started on, which
grows with the world; its checkpoints record it and a resume on another world keeps it,
so that the resumed steps are the uninterrupted run's."""

from __future__ import annotations

import numpy as np
import pytest

from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import epoch_batches
from datacentric.scheduling.resume import (
    Position,
    batch_tokens_to_record,
    kept_global_batch,
    resumed_global_batch,
)
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import SampleShape

#: Enough tokens that no batch is sized from the data: the default cuts the epoch.
SHAPES = [SampleShape(tokens=2_000 + (37 * i) % 6_000) for i in range(600)]

#: Where a loaded state is checked: groups of any size (its steps fill them), seed 5.
ANY_SP = {"sp_sizes": None, "seed": 5}


def batches(bound: int | None, world_size: int) -> list[list[int]]:
    """Epoch 1's global batches (sample ids per step) of :data:`SHAPES`."""
    view = DatasetView(SHAPES)
    found, _ = epoch_batches(
        view,
        np.arange(len(SHAPES)),
        seed=5,
        epoch=1,
        tokens_bound=bound,
        samples_bound=None,
        world_size=world_size,
    )
    return [sorted(batch.tolist()) for batch in found]


def test_the_default_batch_is_recorded_and_a_resume_on_another_world_keeps_it():
    default = SchedulingConfig()
    recorded = batch_tokens_to_record(default, SHAPES, 1)
    assert recorded == 2**18 and batch_tokens_to_record(default, SHAPES, 2) == 2**19
    assert batches(None, 2) != batches(None, 1)  # the default grows with the world
    kept = kept_global_batch(default, recorded, SHAPES, 2)
    assert kept is not None and kept.tokens == recorded
    assert kept.note is not None
    assert "kept at 262,144 tokens" in kept.note and "default to 524,288" in kept.note
    assert batches(kept.applied(default).global_batch_tokens, 2) == batches(None, 1)
    same_world = kept_global_batch(default, recorded, SHAPES, 1)
    assert same_world is not None and same_world.tokens == recorded and same_world.note is None


def test_a_given_batch_is_recorded_and_nothing_is_kept_over_it_or_without_a_record():
    given = SchedulingConfig(global_batch_tokens=300_000)
    assert batch_tokens_to_record(given, SHAPES, 4) == 300_000
    samples = SchedulingConfig(global_batch_samples=64)
    assert batch_tokens_to_record(samples, SHAPES, 4) is None  # the settings hold it
    assert kept_global_batch(given, 2**18, SHAPES, 2) is None  # the settings check decides
    assert kept_global_batch(samples, 2**18, SHAPES, 2) is None
    assert kept_global_batch(SchedulingConfig(), None, SHAPES, 2) is None  # an older record


def test_a_user_loop_s_state_records_the_batch_and_a_resume_on_another_world_keeps_it():
    """``DataCentric.state_dict()`` is a :class:`Position`: it holds the batch the run
    trains (before, it held none, so ``load_state_dict`` on 2 ranks cut the rest of the
    epoch into the 2-rank default's batches); an older state loads as before, and a
    reader that predates a field passes over its key."""
    default = SchedulingConfig()
    state = Position(global_batch_tokens=batch_tokens_to_record(default, SHAPES, 1)).to_json()
    assert state["global_batch_tokens"] == 2**18
    loaded = Position.from_json(state)
    kept = resumed_global_batch(default, loaded, SHAPES, 2, **ANY_SP)
    assert kept is not None and kept.tokens == 2**18
    assert kept.note is not None and "kept at 262,144 tokens" in kept.note
    assert "default to 524,288" in kept.note and "(tokens_per_iteration gives it" in kept.note
    assert batches(kept.applied(default).global_batch_tokens, 2) == batches(None, 1)
    same = SchedulingConfig(global_batch_tokens=2**18)
    assert resumed_global_batch(same, loaded, SHAPES, 2, **ANY_SP) is None  # given: as given
    for other, named in [
        (SchedulingConfig(global_batch_tokens=300_000), "300,000 tokens \\(tokens_per_iteration"),
        (SchedulingConfig(global_batch_samples=64), "64 samples \\(options.global_batch_samples"),
    ]:
        with pytest.raises(ValueError, match=f"^DataCentric: .* 262,144 tokens.* gives {named}"):
            resumed_global_batch(other, loaded, SHAPES, 2, **ANY_SP)
    older = {k: v for k, v in state.items() if k != "global_batch_tokens"}
    assert Position.from_json(older).global_batch_tokens is None
    assert resumed_global_batch(default, Position.from_json(older), SHAPES, 2, **ANY_SP) is None
    assert Position.from_json({**state, "a_later_field": 1}) == loaded
