"""``DataCentric(model, dataset)`` without a global batch checks the default one where it
is chosen, at construction, naming the real cause and a fix that works: a 3-head model
on 4 ranks (SP sizes [1], so 4 samples a step) given 3 samples, and a few long samples
that the default batch cuts into steps of too few. Both were found at the first
``steps()``, advising a larger global batch or dropping the remainder, which could not
help the first. A state loaded on another world keeps the batch it recorded, checked there
as well, at ``load_state_dict``."""

from __future__ import annotations

import pytest
from user_models import tiny_gpt

from datacentric import DataCentric
from datacentric.parallel.groups import ProcessGroups
from datacentric.scheduling.resume import Position
from datacentric.shapes import SampleShape

pytestmark = pytest.mark.usefixtures("one_thread")


class _Samples:
    """A dataset of samples of ``tokens`` tokens each (only its shapes are read)."""

    def __init__(self, *tokens: int) -> None:
        self._shapes = [SampleShape(tokens=t) for t in tokens]

    def shapes(self) -> list[SampleShape]:
        return list(self._shapes)

    def pack(self, ids, pad_to_multiple=1, *, epoch=0):  # never reached
        raise AssertionError("packed before the default batch was checked")


def _world(size: int) -> ProcessGroups:
    """A world of ``size`` ranks as construction sees it before any collective."""
    groups = ProcessGroups.local("cpu")
    groups.world_size = size
    return groups


def test_a_default_batch_the_worlds_groups_cannot_fill_is_refused_at_construction():
    model = tiny_gpt(width=24, heads=3, layers=1)
    with pytest.raises(ValueError) as few:
        DataCentric(model, _Samples(10, 12, 24), groups=_world(4), check_model=False)
    assert str(few.value) == (
        "DataCentric: the dataset has 3 samples and a step on 4 ranks needs one sample in "
        "each of its 4 groups (groups of at most 1 rank: the model's largest SP size, of the "
        "SP sizes [1] the model's heads allow on 4): give 4 samples or more, or run on at "
        "most 3 ranks"
    )
    long = _Samples(*[300_000] * 5)  # the default batch (1,200,000 tokens) cuts 2 steps
    with pytest.raises(ValueError) as short:
        DataCentric(model, long, groups=_world(4), check_model=False)
    line = str(short.value)
    assert line.startswith(
        "DataCentric: the default global batch (1,200,000 tokens) cuts step 1 of epoch 0 "
        "to 3 samples and a step on 4 ranks needs one sample in each of its 4 groups"
    ), line
    assert line.endswith(
        "pass tokens_per_iteration=1500000 or more (every step then holds 4), or run on fewer ranks"
    ), line


def _no_sp():
    """A model of 3 heads: no SP on 2 or 4 ranks (SP sizes [1], one sample a rank)."""
    return tiny_gpt(width=24, heads=3, layers=1)


def test_a_state_whose_kept_batch_this_world_cannot_fill_is_refused_at_load():
    """A loop given no global batch, saved on 1 rank, records its default (262,144 tokens:
    2 or 3 samples of 100,000 a step) and a load on another world keeps it; on 4 ranks of
    a model that runs no SP a step needs 4. Before, ``load_state_dict`` kept it and the
    first ``steps()`` failed advising a larger global batch, which a load refuses."""
    state = Position(global_batch_tokens=2**18, segment_world=1).to_json()
    long = _Samples(*[100_000] * 20)  # the 4-rank default (1,048,576 tokens) fills them
    four = DataCentric(_no_sp(), long, groups=_world(4), check_model=False)
    with pytest.raises(ValueError) as short:
        four.load_state_dict(state)
    assert str(short.value) == (
        "DataCentric: the state to load keeps the global batch of 262,144 tokens its run "
        "trained (so that its steps stay those of the run that saved it; another is "
        "refused), and a step of it holds fewer than the 4 samples 4 ranks in groups of at "
        "most 1 (the model's largest SP size) need: load it on fewer ranks (1 rank, the "
        "world it was saved on), or start a new run (a DataCentric given no state)"
    )
    assert four.pipeline.options.global_batch_tokens is None and four.position == Position()
    two = DataCentric(_no_sp(), long, groups=_world(2), check_model=False)
    two.load_state_dict(state)  # 2 samples a step: it fits
    assert two.pipeline.options.global_batch_tokens == 2**18
