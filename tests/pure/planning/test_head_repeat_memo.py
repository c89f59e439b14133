"""The analytic model's per-pass helpers kept between passes: ``kv_head_repeat`` per
(heads, key/value heads, size) and the text pairs' sources per model's block kinds
(``text_shape_sums``): the same answers as working them out each time."""

from __future__ import annotations

import itertools

import pytest

from datacentric.planning.heads import kv_head_repeat
from datacentric.planning.pass_work import attention_pairs, shape_sums, text_shape_sums
from datacentric.shapes import SampleShape


def repeat_by_hand(heads: int, kv_heads: int, sp: int) -> int:
    group = heads // kv_heads
    return min(r for r in range(1, group + 1) if group % r == 0 and kv_heads * r % sp == 0)


def test_kv_head_repeat_kept_is_the_rule_and_a_size_not_allowed_still_raises() -> None:
    for heads, kv_heads in ((32, 32), (32, 8), (64, 8), (28, 4), (40, 40)):
        for sp in (s for s in range(1, heads + 1) if heads % s == 0):
            expected = repeat_by_hand(heads, kv_heads, sp)
            assert kv_head_repeat(heads, kv_heads, sp) == expected
            hits = kv_head_repeat.cache_info().hits
            assert kv_head_repeat(heads, kv_heads, sp) == expected
            assert kv_head_repeat.cache_info().hits == hits + 1  # kept, not worked out again
    for _ in range(2):  # an error is not kept: raised on every call
        with pytest.raises(ValueError):
            kv_head_repeat(32, 8, 3)


def test_text_sums_pairs_are_each_kinds_sum_over_the_samples() -> None:
    lengths = (1, 7, 300, 4097)
    shapes = [SampleShape.text(t) for t in lengths]
    tokens, squares = sum(lengths), sum(t * t for t in lengths)
    kinds_all = ("full", "causal", "spatial", "temporal")
    for kinds in itertools.chain.from_iterable(
        itertools.product(kinds_all, repeat=n) for n in (1, 2, 3)
    ):
        found = text_shape_sums(kinds, len(lengths), tokens, squares)
        assert found == shape_sums(kinds, shapes)
        by_sample = tuple(sum(attention_pairs(k, s) for s in shapes) for k in kinds)
        assert found.pairs == by_sample  # exact: integer sums, halved once
        assert all(type(p) is float for p in found.pairs)
    assert text_shape_sums(("causal", "cross"), 4, tokens, squares) is None
