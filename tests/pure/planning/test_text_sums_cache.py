"""Text passes keyed by their sums (``CachedCostModel.prices_text_by_sums``): one cached
answer for passes equal in samples, tokens and squared tokens, the same to the bit as
pricing each pass afresh."""

from __future__ import annotations

import numpy as np

from datacentric.planning.cost_model import WrappedCostModel, lengths_sums, text_sums
from datacentric.planning.fitted import FittedCostModel
from datacentric.planning.forward_only import ForwardOnlyCostModel
from datacentric.profiling.factory import analytic_cost_model
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.shapes import SampleShape

# the same samples, tokens (12) and squared tokens (62), different lengths
A = [SampleShape.text(t) for t in (1, 5, 6)]
B = [SampleShape.text(t) for t in (7, 2, 3)]


def fresh():
    return analytic_cost_model("llama-7b", "h200-sxm", world_size=64)


def test_passes_equal_in_their_sums_share_one_answer_equal_to_a_fresh_one() -> None:
    model = fresh()
    flags = (True,) * 16 + (False,) * 16
    rng = np.random.default_rng(0)
    for sp, ring in ((1, 1), (8, 1), (8, 8), (16, 2)):
        scale = int(rng.integers(1, 4000))
        a = [SampleShape.text(s.tokens * scale) for s in A]
        b = [SampleShape.text(s.tokens * scale) for s in B]
        first = model.breakdown(a, sp, flags, ring_size=ring)
        assert model.breakdown(b, sp, flags, ring_size=ring) is first  # one entry
        assert fresh().breakdown(b, sp, flags, ring_size=ring) == first  # to the bit
        assert model.pass_memory_bytes(b, sp, flags, ring_size=ring) == first.memory_bytes
    copies = [SampleShape.text(300)] * 8
    assert text_sums(copies) == text_sums([SampleShape.text(300) for _ in range(8)])
    assert text_sums(copies) == ("text", 8, 2400, 720_000)
    assert text_sums([*A, SampleShape.video(2, 2, 2)]) is None  # video: keyed by shapes


def test_only_a_model_that_reads_nothing_else_keys_by_sums() -> None:
    assert fresh().prices_text_by_sums
    assert not FittedCostModel.prices_text_by_sums  # sums floats per sample
    wrapped = ForwardOnlyCostModel(fresh())
    assert isinstance(wrapped, WrappedCostModel) and not wrapped.prices_text_by_sums


def test_the_schedulers_exact_times_are_the_models_for_each_micro_batch() -> None:
    model = fresh()
    view = DatasetView([*A, *B, SampleShape.text(4)])
    rc = (False,) * 32
    t_a = view.exact_time(model, [0, 1, 2], 8, rc)
    assert view.exact_time(model, [3, 4, 5], 8, rc) == t_a == fresh().pass_time_s(B, 8, rc)
    assert view.exact_time(model, [0, 6], 8, rc) == fresh().pass_time_s(
        [A[0], SampleShape.text(4)], 8, rc
    )


def test_the_sums_of_many_micro_batches_at_once_are_each_ones_own() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300_000, size=500)
    view = DatasetView([SampleShape.text(int(t)) for t in lengths])
    batches = [
        rng.choice(500, size=int(rng.integers(1, 40)), replace=False).tolist() for _ in range(200)
    ]
    want = [lengths_sums([int(lengths[i]) for i in ids]) for ids in batches]
    assert view.batch_sums(batches) == want
    assert all(type(v) is int for row in view.batch_sums(batches) for v in row[1:])
    # past int64 (squares of 2**31 tokens): Python's integers, not wrapped ones
    huge = DatasetView([SampleShape.text(2**31 + k) for k in range(3)])
    assert huge.batch_sums([[0, 1, 2], [2]]) == [
        lengths_sums([2**31, 2**31 + 1, 2**31 + 2]),
        lengths_sums([2**31 + 2]),
    ]
    model, rc = fresh(), (False,) * 32
    for ids, sums in zip(batches[:20], view.batch_sums(batches[:20])):
        given = view.exact_time(model, ids, 8, rc, sums=sums)
        assert given == DatasetView(view.shapes).exact_time(fresh(), ids, 8, rc)
