"""``DataCentric(model, dataset)`` without a global batch checks the default one where it
is chosen, at construction, naming the real cause and a fix that works: a 3-head model
on 4 ranks (SP sizes [1], so 4 samples a step) given 3 samples, and a few long samples
that the default batch cuts into steps of too few. Both were found at the first
``steps()``, advising a larger global batch or dropping the remainder, which could not
help the first."""

from __future__ import annotations

import pytest
from user_models import tiny_gpt

from datacentric import DataCentric
from datacentric.parallel.groups import ProcessGroups
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
