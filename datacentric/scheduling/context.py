"""What every policy works from: the dataset as arrays, and cached bucket costs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.scheduling.costs import (
    Config,
    best_config,
    candidate_sp_sizes,
    chain_sizes,
    fits_shapes,
    safe_time,
)
from datacentric.scheduling.item import Item
from datacentric.shapes import Bucket, SampleShape, make_buckets


class DatasetView:
    """Sample shapes as numpy arrays: tokens and bucket per sample id.

    Buckets come from :func:`datacentric.shapes.make_buckets` (the same names the
    planner uses), computed on the distinct shapes only so that a million samples
    cost one pass over the list.
    """

    def __init__(self, shapes: Sequence[SampleShape]) -> None:
        if len(shapes) == 0:
            raise ValueError("cannot schedule an empty dataset: there are no samples")
        self.shapes = shapes
        tokens = np.fromiter(map(attrgetter("tokens"), shapes), dtype=np.int64, count=len(shapes))
        grids = list(map(attrgetter("grid"), shapes))
        video = np.fromiter((g is not None for g in grids), dtype=bool, count=len(shapes))
        # Distinct shapes: text by token count (vectorised), video by grid.
        text_values, text_codes = np.unique(tokens[~video], return_inverse=True)
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
        order = np.argsort(self.bucket_of, kind="stable")
        bounds = np.searchsorted(self.bucket_of[order], np.arange(len(self.buckets) + 1))
        self.members = [order[bounds[b] : bounds[b + 1]] for b in range(len(self.buckets))]
        self.bucket_index = {bk.name: b for b, bk in enumerate(self.buckets)}
        self._exact: dict[tuple, float] = {}

    @property
    def num_samples(self) -> int:
        return len(self.shapes)

    def rep_tokens(self, b: int) -> int:
        return self.buckets[b].shape.tokens

    def exact_time(self, cost_model: CostModel, ids: Sequence[int], sp: int, rc: tuple) -> float:
        """The cost model's time for the micro-batch of samples ``ids`` (memoised)."""
        buckets = self.bucket_of[ids]
        b = int(buckets[0])
        if self.uniform[b] and (buckets == b).all():
            key: tuple = (b, len(ids), sp, rc)
        else:
            key = (tuple(self.shapes[i] for i in ids), sp, rc)
        t = self._exact.get(key)
        if t is None:
            t = self._exact[key] = safe_time(cost_model, [self.shapes[i] for i in ids], sp, rc)
        return t


class CostTable:
    """Lazily evaluated :class:`Config` per (bucket, SP size), best over a policy's
    recomputation candidates, with the bucket's preferred (cheapest) SP size."""

    def __init__(
        self,
        view: DatasetView,
        cost_model: CostModel,
        *,
        world_size: int,
        memory_cap_bytes: int,
        max_sp_size: int | None,
        max_micro_batch_size: int,
        recomputes: Callable[[int], Sequence[tuple[bool, ...]]],
        exact_estimates: bool = True,
    ) -> None:
        self.view = view
        self.cost_model = cost_model
        self.world_size = world_size
        self.cap = memory_cap_bytes
        self.limit = max_micro_batch_size
        self.recomputes = recomputes
        self.exact_estimates = exact_estimates
        self.node_sizes = candidate_sp_sizes(world_size, cost_model.gpus_per_node, max_sp_size)
        self.all_sizes = chain_sizes(world_size)
        #: the model's own test of an SP size (Ulysses: it must divide the heads)
        self.supports = getattr(cost_model, "supports_sp_size", None)
        self._configs: dict[tuple[int, int], Config | None] = {}
        self._preferred: dict[int, Config] = {}

    def config(self, b: int, sp: int) -> Config | None:
        """Best config of bucket ``b`` on ``sp`` ranks (None: does not fit)."""
        key = (b, sp)
        if key not in self._configs:
            if self.supports is not None and not self.supports(sp):
                self._configs[key] = None
                return None
            shape = self.view.buckets[b].shape
            self._configs[key] = best_config(
                self.cost_model, shape, sp, self.recomputes(b), self.cap, self.limit
            )
        return self._configs[key]

    def preferred(self, b: int) -> Config:
        """The config with the fewest GPU-seconds per sample: within a node when
        anything fits there, else the smallest larger size that fits."""
        if b not in self._preferred:
            options = [c for s in self.node_sizes if (c := self.config(b, s)) is not None]
            if not options:
                larger = [s for s in self.all_sizes if s > self.node_sizes[-1]]
                options = [c for s in larger if (c := self.config(b, s)) is not None][:1]
            if not options:
                bucket = self.view.buckets[b]
                raise ValueError(
                    f"bucket {bucket.name!r} ({bucket.shape.tokens} tokens per sample) fits no "
                    f"SP size up to {self.world_size} under the memory cap of "
                    f"{self.cap / 2**30:.2f} GiB with the recomputation settings "
                    f"{sorted({sum(r) for r in self.recomputes(b)})} (blocks recomputed); "
                    "use a larger world, a larger cap, or a plan that skips the bucket"
                )
            self._preferred[b] = min(options, key=lambda c: (c.gpu_seconds_per_sample, c.sp))
        return self._preferred[b]

    def min_sp(self, b: int) -> int:
        """The smallest SP size on which one sample of bucket ``b`` fits."""
        for s in self.all_sizes:
            if self.config(b, s) is not None:
                return s
        self.preferred(b)  # raises the error that names the bucket
        raise AssertionError("unreachable")

    def count_of(self, b: int, count: int, tokens: int) -> float:
        """How many representatives a micro-batch of ``count`` samples of ``tokens``
        total amounts to (exact for uniform buckets, by tokens otherwise)."""
        if self.view.uniform[b]:
            return float(count)
        return tokens / self.view.rep_tokens(b)

    def item_time(self, item: Item, sp: int) -> float:
        """Estimated time of ``item`` on ``sp`` ranks (infinity where it does not fit).

        A micro-batch of a text bucket is packed by tokens: its members are no
        longer than the representative and sum to at most ``max_batch``
        representatives, so its attention work (sum of squared lengths) and its
        activations are bounded by the representative micro-batch's: memory-safe.
        A micro-batch that mixes buckets, or a single sample shorter than its
        representative, is asked of the cost model directly.
        """
        cfg = self.config(item.bucket, sp)
        if cfg is None:
            return float("inf")
        if item.count == 1 and not self.view.uniform[item.bucket]:
            return self.view.exact_time(self.cost_model, item.ids, sp, cfg.recompute)
        if item.mixed:
            shapes = [self.view.shapes[i] for i in item.ids]
            if not fits_shapes(self.cost_model, shapes, sp, cfg.recompute, self.cap):
                return float("inf")
            return self.view.exact_time(self.cost_model, item.ids, sp, cfg.recompute)
        units = self.count_of(item.bucket, item.count, item.tokens)
        if units > cfg.max_batch:
            return float("inf")
        return cfg.time(units)

    def estimates(self, settings: Sequence[tuple[Item, int, tuple[bool, ...]]]) -> list[float]:
        """The times ``MicroBatch.est_time_s`` carries for ``(item, sp, recompute)``:
        the cost model's own answer on the item's samples or, with ``exact_estimates``
        off, the bucket curve's for multi-sample micro-batches of one text bucket
        (vectorised per bucket and SP size)."""
        view = self.view
        out = [0.0] * len(settings)
        curve: dict[tuple[int, int], list[int]] = {}
        uniform: dict[tuple, float] = {}
        for n, (item, sp, rc) in enumerate(settings):
            if view.uniform[item.bucket] and not item.mixed:  # one shape: memoise by count
                key = (item.bucket, item.count, sp, rc)
                t = uniform.get(key)
                if t is None:
                    t = uniform[key] = view.exact_time(self.cost_model, item.ids, sp, rc)
                out[n] = t
                continue
            cfg = None
            if not (self.exact_estimates or view.uniform[item.bucket] or item.mixed):
                cfg = self.config(item.bucket, sp) if item.count > 1 else None
            if cfg is not None and cfg.recompute == rc:
                curve.setdefault((item.bucket, sp), []).append(n)
            else:
                out[n] = view.exact_time(self.cost_model, item.ids, sp, rc)
        for (b, sp), rows in curve.items():
            units = [settings[n][0].tokens / view.rep_tokens(b) for n in rows]
            for n, t in zip(rows, self.config(b, sp).times_for(np.asarray(units)).tolist()):
                out[n] = t
        return out
