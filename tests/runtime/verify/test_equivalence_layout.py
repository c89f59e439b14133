"""The step ``datacentric equivalence`` chooses is one the model's heads run: its SP
group is of a size they split among, and a ``--sp-split`` they do not is refused before
any rank starts."""

from __future__ import annotations

import pytest

from datacentric.verify import equivalence
from datacentric.verify.equivalence import check_equivalence, default_layout

pytestmark = pytest.mark.usefixtures("one_thread")

THREE_HEADS = {"heads": 3, "width": 48}


class Started(Exception):
    """The ranks would start here."""


@pytest.fixture
def ranks_never_start(monkeypatch) -> list:
    """The cases the ranks would run, caught before they start."""
    seen: list = []

    def caught(cases, world_size, **settings):
        seen.extend(cases)
        raise Started

    monkeypatch.setattr(equivalence, "run_distributed", caught)
    return seen


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("phased", [False, True])
def test_a_3_head_model_is_checked_on_groups_its_heads_split_among(
    world, phased, ranks_never_start
):
    """A 3-head model: the default step put ranks 0-1 in an SP-2 group, and every rank
    stopped ('the model has 3 attention heads, not divisible by SP size 2'), the layout
    being the command's own; its groups are now of one rank each."""
    with pytest.raises(Started):
        check_equivalence(
            ["tests.user_models:tiny_gpt"], world, model_args=THREE_HEADS, phased=phased
        )
    ((_, iteration),) = ranks_never_start
    assert {a.sp_size for a in iteration.assignments} == {1}
    assert {a.rank_start for a in iteration.assignments} == set(range(world))


def test_a_split_the_heads_do_not_allow_is_refused_before_the_ranks(ranks_never_start):
    with pytest.raises(ValueError, match="3 attention heads, not divisible by SP size 2"):
        check_equivalence(
            ["tests.user_models:tiny_gpt"], 4, model_args=THREE_HEADS, sp_split=(2, 1)
        )
    assert ranks_never_start == []


def test_the_default_layout_keeps_its_sp_group_where_the_heads_allow_it():
    assert default_layout(4) == default_layout(4, [1, 2, 4]) == [2, 1, 1]
    assert default_layout(8, [1, 2]) == [2, 1, 1, 1, 1, 1, 1]
    assert default_layout(8, [1, 3]) == [1] * 8
    assert default_layout(2, [1, 3]) == [1, 1] and default_layout(2, [1, 2]) == [2]
