"""What the global-batch notes and refusals say: the limit on a group's ranks named where
it comes from (``--max-sp-size`` when the user's setting sets it, the model otherwise),
megatron-dyncp's CP groups' limit said the same way (:class:`GroupCap`),
and a count said with its unit in the singular when it is one."""

from __future__ import annotations

import pytest
from test_search_progress import MODEL
from toy_cost_model import toy_pipeline

from datacentric.progress import counted
from datacentric.scheduling.global_batches import check_global_batch, size_global_batch
from datacentric.settings import load_config
from datacentric.shapes import SampleShape

TOKENS = [12, 24, 60, 12, 24, 12, 20, 8, 30, 36, 12, 24, 10]


def test_counted_says_one_in_the_singular():
    assert counted(1, "step") == "1 step" and counted(0, "step") == "0 steps"
    assert counted(3, "rank") == "3 ranks" and counted(2, "micro-batch") == "2 micro-batches"
    assert counted(1024, "token", ",") == "1,024 tokens"


def test_a_refusal_names_the_users_max_sp_size_not_the_model():
    """World 8, a model that allows groups of 4, ``--max-sp-size 2``: the setting limits."""
    capped = load_config(None, max_sp_size=2).scheduling
    with pytest.raises(ValueError) as err:
        size_global_batch(capped, [5, 7], world_size=8, largest_sp=4)
    message = str(err.value)
    assert "in groups of at most 2 ranks (--max-sp-size 2, [scheduling] max_sp_size)" in message
    assert "model" not in message and message.endswith("or a larger --max-sp-size")
    assert message.startswith("the dataset has 2 samples, and a step on 8 ranks")
    with pytest.raises(ValueError) as err:  # the model limits: the setting is above it
        size_global_batch(
            load_config(None, max_sp_size=8).scheduling, [5], world_size=8, largest_sp=4
        )
    message = str(err.value)
    assert "the dataset has 1 sample, and" in message
    assert "(the model's largest SP size) needs 2" in message and "--max-sp-size" not in message


def test_a_sized_batch_note_names_the_setting_and_says_one_step():
    capped = load_config(None, max_sp_size=2).scheduling
    note = size_global_batch(capped, TOKENS, world_size=4, largest_sp=4).note
    assert "groups of at most 2, --max-sp-size 2, [scheduling] max_sp_size)" in note
    assert "model" not in note
    note = size_global_batch(
        load_config(None).scheduling, [40, 40], world_size=2, largest_sp=1
    ).note
    assert "about 1 step an epoch" in note and "(the model's largest SP size" not in note
    assert "groups of at most 1, the model's largest SP size)" in note


def test_a_short_step_refusal_names_the_setting():
    given = load_config(None, global_batch_tokens=60, max_sp_size=2).scheduling
    shapes = [SampleShape.text(t) for t in TOKENS]
    with pytest.raises(ValueError) as err:
        check_global_batch(given, shapes, world_size=4, largest_sp=4, seed=0, epochs=3)
    message = str(err.value)
    assert "in groups of at most 2 (--max-sp-size 2, [scheduling] max_sp_size) need 2" in message
    assert "model" not in message


def test_megatron_names_where_its_cp_groups_limit_comes_from():
    """A sequence longer than megatron-dyncp's CP groups hold at a fixed per-rank cap: the
    refusal names ``--max-sp-size`` when it sets the limit, the model otherwise."""
    shapes = [SampleShape.text(t) for t in (100, 200, 9000, 500, 300, 400, 600, 700)]
    said = {}
    for max_sp_size in (2, None):
        options = load_config(
            None, max_sp_size=max_sp_size, megatron_tokens_per_rank=1000, global_batch_samples=8
        ).scheduling
        pipeline = toy_pipeline(shapes, MODEL, world_size=8, options=options)
        with pytest.raises(ValueError) as err:
            pipeline.schedule(policy="megatron-dyncp")
        said[max_sp_size] = str(err.value)
    assert (
        "CP groups hold at most 2 ranks here (--max-sp-size 2, [scheduling] max_sp_size); "
        "raise megatron_tokens_per_rank, or a larger --max-sp-size" in said[2]
    ), said[2]
    assert "CP groups hold at most 8 ranks here (the model's largest SP size); " in said[None]
    assert "--max-sp" not in said[None] and "max_sp_size" not in said[None]
