"""The dataset as the policies see it: sample shapes as arrays, grouped in buckets."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter, is_not

import numpy as np

from datacentric.planning.bucket_options import safe_time
from datacentric.planning.cost_model import CostModel, lengths_sums
from datacentric.shapes import Bucket, SampleShape, make_buckets, stable_order


def distinct_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of positive token counts: counted
    (``np.bincount``) where the largest is at most a few times their number, the same
    distinct values ascending and the same index of each value among them."""
    if len(values) == 0 or int(values.max()) > max(4 * len(values), 1 << 20):
        return np.unique(values, return_inverse=True)
    present = np.bincount(values) > 0
    index = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(values.dtype), index[values]


class DatasetView:
    """Sample shapes as numpy arrays: tokens and bucket per sample id.

    Buckets come from :func:`datacentric.shapes.make_buckets` (the same names the
    planner uses), computed on the distinct shapes only so that a million samples
    cost one pass over the list; each bucket's members are in id order
    (:func:`datacentric.shapes.stable_order`, the order the data order sorts by too).
    """

    def __init__(self, shapes: Sequence[SampleShape]) -> None:
        if len(shapes) == 0:
            raise ValueError("cannot schedule an empty dataset: there are no samples")
        self.shapes = shapes
        tokens = np.fromiter(map(attrgetter("tokens"), shapes), dtype=np.int64, count=len(shapes))
        grids = list(map(attrgetter("grid"), shapes))
        video = np.fromiter(map(is_not, grids, repeat(None)), dtype=bool, count=len(shapes))
        # Distinct shapes: text by token count (vectorised), video by grid.
        text_values, text_codes = distinct_counts(tokens[~video])
        distinct: list[SampleShape] = [SampleShape.text(int(t)) for t in text_values.tolist()]
        code_of = np.empty(len(shapes), dtype=np.int64)
        code_of[~video] = text_codes
        video_ids = np.flatnonzero(video)
        if len(video_ids):
            grid = np.asarray([grids[i] for i in video_ids.tolist()], dtype=np.int64)
            if grid.max() < 2**21:  # one int64 key per grid
                key = (grid[:, 0] << 42) | (grid[:, 1] << 21) | grid[:, 2]
                _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            else:
                _, first, inverse = np.unique(grid, axis=0, return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1)
            code_of[video_ids] = len(distinct) + inverse
            distinct += [shapes[int(video_ids[f])] for f in first.tolist()]
        bucketing = make_buckets(distinct)
        self.buckets: tuple[Bucket, ...] = bucketing.buckets
        self.bucket_of = np.asarray(bucketing.bucket_of_sample, dtype=np.int64)[code_of]
        self.tokens = tokens
        distinct_per_bucket = np.bincount(
            np.asarray(bucketing.bucket_of_sample), minlength=len(self.buckets)
        )
        #: a bucket whose members all have its representative's shape
        self.uniform = distinct_per_bucket == 1
        for d, b in enumerate(bucketing.bucket_of_sample):
            self.uniform[b] &= distinct[d] == self.buckets[b].shape
        order = stable_order(self.bucket_of, len(self.buckets))
        bounds = np.searchsorted(self.bucket_of[order], np.arange(len(self.buckets) + 1))
        self.members = [order[bounds[b] : bounds[b + 1]] for b in range(len(self.buckets))]
        self.bucket_index = {bk.name: b for b, bk in enumerate(self.buckets)}
        self._exact: dict[tuple, float] = {}
        self._all_text = not video.any()

    @cached_property
    def _lists(self) -> tuple[list[int], list[int]]:
        """:attr:`bucket_of` and :attr:`tokens` as lists."""
        return self.bucket_of.tolist(), self.tokens.tolist()

    @property
    def num_samples(self) -> int:
        return len(self.shapes)

    def rep_tokens(self, b: int) -> int:
        return self.buckets[b].shape.tokens

    def keys_by_sums(self, cost_model: CostModel) -> bool:
        """Whether :meth:`exact_time` keys this data's micro-batches of several samples by
        their sums (all text, and a model that prices text so)."""
        return self._all_text and bool(getattr(cost_model, "prices_text_by_sums", False))

    def batch_sums(self, batches: Sequence[Sequence[int]]) -> list[tuple]:
        """:func:`lengths_sums` of each micro-batch's samples (``batches``: their ids), in
        one pass over them all (integer sums, so the same numbers as one at a time)."""
        counts = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        flat = np.fromiter(chain.from_iterable(batches), dtype=np.int64, count=int(counts.sum()))
        lengths = self.tokens[flat]
        if len(lengths) == 0 or int(lengths.max()) ** 2 * int(counts.max()) >= 2**62:
            _, tokens = self._lists  # sums past int64: Python's integers
            return [lengths_sums(list(map(tokens.__getitem__, ids))) for ids in batches]
        starts = np.cumsum(counts) - counts
        total = np.add.reduceat(lengths, starts).tolist()
        squares = np.add.reduceat(lengths * lengths, starts).tolist()
        return [("text", *row) for row in zip(counts.tolist(), total, squares)]

    def exact_time(
        self,
        cost_model: CostModel,
        ids: Sequence[int],
        sp: int,
        rc: tuple,
        ring: int = 1,
        sums: tuple | None = None,
    ) -> float:
        """The cost model's time for the micro-batch of samples ``ids`` on ``sp`` ranks
        with a ring of ``ring`` (memoised; text micro-batches by their sums where the model
        prices them so, ``prices_text_by_sums``; ``sums``: their :meth:`batch_sums` when
        the caller has them)."""
        bucket_of, tokens = self._lists  # (Python lists: a micro-batch has a few samples)
        b = bucket_of[ids[0]]
        if self.uniform[b] and all(bucket_of[i] == b for i in ids):
            key: tuple = (b, len(ids), sp, rc, ring)
        elif len(ids) == 1 and self.shapes[ids[0]].grid is None:
            key = (tokens[ids[0]], sp, rc, ring)  # one text sample: its length
        elif self.keys_by_sums(cost_model):
            if sums is None:
                sums = lengths_sums(list(map(tokens.__getitem__, ids)))
            key = (*sums, sp, rc, ring)
        else:
            key = (tuple(int(i) for i in ids), sp, rc, ring)  # ids name the shapes (fast hash)
        t = self._exact.get(key)
        if t is None:
            shapes = [self.shapes[i] for i in ids]
            t = self._exact[key] = safe_time(cost_model, shapes, sp, rc, ring)
        return t
