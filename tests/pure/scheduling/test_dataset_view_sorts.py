"""The dataset view's sorts by counting and radix (its order by bucket is the shapes'
module's, :func:`~datacentric.shapes.stable_order`): the same answers as numpy's
general ones (``np.argsort(kind="stable")``, ``np.unique(return_inverse=True)``)."""

from __future__ import annotations

import numpy as np

from datacentric.scheduling.dataset_view import distinct_counts
from datacentric.shapes import stable_order


def test_stable_order_is_the_stable_argsort_at_every_width() -> None:
    rng = np.random.default_rng(0)
    for n_codes in (1, 2, 255, 256, 257, 65_535, 65_536, 65_537, 200_000):
        codes = rng.integers(0, n_codes, size=20_000)
        codes[:3] = n_codes - 1  # the widest code each type must hold
        got = stable_order(codes, n_codes)
        assert got.dtype == np.intp and np.array_equal(got, np.argsort(codes, kind="stable"))
    assert len(stable_order(np.array([], dtype=np.int64), 4)) == 0


def test_distinct_counts_are_numpys_unique_counted_or_sorted() -> None:
    rng = np.random.default_rng(1)
    for high in (2, 1_000, 300_000, 10**9):  # counted, counted, counted, sorted
        values = rng.integers(1, high, size=50_000)
        want_values, want_index = np.unique(values, return_inverse=True)
        got_values, got_index = distinct_counts(values)
        assert got_values.dtype == want_values.dtype and np.array_equal(got_values, want_values)
        assert np.array_equal(got_index, want_index) and got_index.shape == want_index.shape
    empty = distinct_counts(np.array([], dtype=np.int64))
    assert len(empty[0]) == len(empty[1]) == 0
