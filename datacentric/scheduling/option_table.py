"""What each bucket costs at each SP size: the plan's options, as the policies read them.

Everything the policies know about time and memory comes from the
:class:`~datacentric.planning.plan.Plan`: per bucket, its options (SP size,
recomputation, largest micro-batch of its representative, time curve), computed by
the planner on the bucket's representative (its largest member, so the answer is
memory-safe for every member). An :class:`OptionTable` restricts them to the
recomputation settings a policy allows and picks, per (bucket, SP size), the one
with the fewest GPU-seconds per sample; it searches nothing. Policies then estimate
a micro-batch by interpolating in the number of samples (or, for text buckets whose
members differ, in tokens over the representative's tokens); the final
``MicroBatch.est_time_s`` is the cost model's own answer on the actual shapes
(:meth:`DatasetView.exact_time`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from datacentric.planning.bucket_options import (
    BucketOption,
    cheapest,
    fits_shapes,
)
from datacentric.planning.cost_model import CostModel
from datacentric.planning.heads import mixable_sp_sizes, nesting_sp_sizes
from datacentric.planning.plan import Plan
from datacentric.planning.planner import choose_recompute
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.item import Item

#: Which of a bucket's options a table may use.
OptionFilter = Callable[[BucketOption], bool]


class OptionTable:
    """Per (bucket, SP size), the cheapest of the plan's options that ``allowed``
    admits, with the bucket's preferred (cheapest) SP size."""

    def __init__(
        self,
        view: DatasetView,
        cost_model: CostModel,
        plan: Plan,
        *,
        world_size: int,
        max_sp_size: int | None,
        allowed: OptionFilter,
        exact_estimates: bool = True,
        per_micro_batch: bool = False,
        mixed_knapsack: bool = True,
    ) -> None:
        self.view = view
        self.cost_model = cost_model
        self.plan = plan
        self.world_size = world_size
        self.max_sp_size = max_sp_size
        self.cap = plan.memory_cap_bytes
        self.allowed = allowed
        self.exact_estimates = exact_estimates
        #: PAC per micro-batch: a single sample or a mixed micro-batch runs the planner's
        #: fastest recomputation that fits its own samples (:meth:`micro_batch_recompute`)
        self.per_micro_batch = per_micro_batch
        #: ... mixed micro-batches too (off: single samples only; the knapsack on a pass of
        #: hundreds of samples costs hundreds of the cost model's per-sample terms)
        self.mixed_knapsack = mixed_knapsack
        self._own_choice: dict[tuple, tuple[tuple[bool, ...], float] | None] = {}
        self.node_sizes = nesting_sp_sizes(world_size, cost_model.gpus_per_node, max_sp_size)
        self.all_sizes = mixable_sp_sizes(world_size)
        self._options: dict[int, list[BucketOption]] = {}
        self._configs: dict[tuple[int, int], BucketOption | None] = {}
        self._at: dict[tuple[int, int], list[BucketOption]] = {}
        self._preferred: dict[int, BucketOption] = {}
        #: certified prices of sample shapes (``measures``), shared through the plan
        self.prices, self.price_guesses = plan.prices_for(cost_model)

    def options(self, b: int) -> list[BucketOption]:
        """The plan's options of bucket ``b`` this table admits."""
        if b not in self._options:
            bucket = self.view.buckets[b]
            found = self.plan.options_of(bucket.name)
            planned = self.plan.buckets[bucket.name].shape.tokens
            if planned < bucket.shape.tokens:  # options of shorter samples: not memory-safe
                raise ValueError(
                    f"the plan's bucket {bucket.name!r} was planned for samples of up to "
                    f"{planned} tokens, this data has {bucket.shape.tokens}: plan the "
                    "dataset again"
                )
            self._options[b] = [o for o in found if self.allowed(o)]
        return self._options[b]

    def recomputes(self, b: int) -> list[tuple[bool, ...]]:
        """The recomputation settings of bucket ``b``'s admitted options."""
        return list(dict.fromkeys(o.recompute for o in self.options(b)))

    def config(self, b: int, sp: int) -> BucketOption | None:
        """The cheapest admitted option of bucket ``b`` on ``sp`` ranks (None: none)."""
        key = (b, sp)
        if key not in self._configs:
            self._configs[key] = cheapest(self.options_at(b, sp))
        return self._configs[key]

    def options_at(self, b: int, sp: int) -> list[BucketOption]:
        """The admitted options of bucket ``b`` on ``sp`` ranks."""
        key = (b, sp)
        if key not in self._at:
            self._at[key] = [o for o in self.options(b) if o.sp_size == sp]
        return self._at[key]

    def has_rings(self, buckets: Iterable[int], sp: int) -> bool:
        """Whether the admitted options on ``sp`` ranks of some bucket of ``buckets``
        run a ring (a split with a ring degree above 1)."""
        return any(o.ring_size > 1 for b in set(buckets) for o in self.options_at(b, sp))

    def ring_sizes_past_node(self, b: int) -> list[int]:
        """The SP sizes past a node (up to ``max_sp_size``) where bucket ``b`` has a
        ring option: the ideal bound prices its samples there too."""
        top = self.max_sp_size or self.world_size
        node = self.node_sizes[-1]
        return [s for s in self.all_sizes if node < s <= top and self.has_rings([b], s)]

    def bound_sizes_past_node(self, b: int) -> list[int]:
        """The SP sizes past :attr:`node_sizes` the ideal bound prices bucket ``b`` on:
        :meth:`ring_sizes_past_node`, and the whole world when it is not a power of
        two (3, 6, 12 ranks: a step may run on it, e.g. ``static`` at one size for all,
        so a sample may cost fewer GPU-seconds there than on any nesting size)."""
        sizes = self.ring_sizes_past_node(b)
        world = self.world_size
        whole = world not in self.node_sizes and world & (world - 1) != 0
        if whole and world <= (self.max_sp_size or world) and world not in sizes:
            sizes.append(world)
        return sizes

    def option_with(
        self, b: int, sp: int, rc: tuple[bool, ...], ring: int | None = None
    ) -> BucketOption | None:
        """Bucket ``b``'s admitted option on ``sp`` ranks with recomputation ``rc`` (and
        ring degree ``ring`` when given)."""
        return next(
            (
                o
                for o in self.options_at(b, sp)
                if o.recompute == rc and (ring is None or o.ring_size == ring)
            ),
            None,
        )

    def preferred(self, b: int) -> BucketOption:
        """The option with the fewest GPU-seconds per sample: within a node when
        anything fits there, else the smallest larger size that fits."""
        if b not in self._preferred:
            options = [c for s in self.node_sizes if (c := self.config(b, s)) is not None]
            if not options:
                larger = [s for s in self.all_sizes if s > self.node_sizes[-1]]
                options = [c for s in larger if (c := self.config(b, s)) is not None][:1]
            if not options:
                bucket = self.view.buckets[b]
                raise ValueError(
                    f"bucket {bucket.name!r} ({bucket.shape.tokens} tokens per sample) has no "
                    f"option up to SP size {self.world_size} under the plan's memory cap of "
                    f"{self.cap} bytes with the recomputation settings "
                    f"{sorted({sum(r) for r in self.recomputes(b)})} (blocks recomputed); "
                    "use a larger world, a larger cap, or a plan that skips the bucket"
                )
            self._preferred[b] = min(options, key=lambda c: (c.gpu_seconds_per_sample, c.sp_size))
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

    def fits(self, ids: Sequence[int], sp: int, rc: tuple[bool, ...], ring: int = 1) -> bool:
        """Whether the micro-batch of samples ``ids`` fits the plan's cap on ``sp``
        ranks with a ring of ``ring`` (asked of the cost model: for micro-batches
        mixing shapes)."""
        shapes = [self.view.shapes[i] for i in ids]
        return fits_shapes(self.cost_model, shapes, sp, rc, self.cap, ring)

    def item_time(self, item: Item, sp: int) -> float:
        """Estimated time of ``item`` on ``sp`` ranks (infinity where it does not fit):
        that of :meth:`item_option`."""
        return self.item_option(item, sp)[1]

    def item_option(self, item: Item, sp: int) -> tuple[BucketOption | None, float]:
        """The admitted option on ``sp`` ranks that runs ``item`` fastest, and its time
        (``(None, inf)`` where none fits). Options differ in recomputation, so a
        micro-batch smaller than the cheapest option's largest may fit, and run faster
        under, one that recomputes less.

        A micro-batch of a text bucket is packed by tokens: its members are no
        longer than the representative and sum to at most ``max_batch``
        representatives, so its attention work (sum of squared lengths) and its
        activations are bounded by the representative micro-batch's: memory-safe.
        A micro-batch that mixes buckets, or a single sample shorter than its
        representative, is asked of the cost model directly.
        """
        best: tuple[BucketOption | None, float] = (None, float("inf"))
        for cfg in self.options_at(item.bucket, sp):
            t = self._time_with(item, sp, cfg)
            if t < best[1]:
                best = (cfg, t)
        return best

    def item_options(self, items: Sequence[Item], sp: int) -> list[BucketOption | None]:
        """:meth:`item_option`'s option for every item of ``items`` on ``sp`` ranks,
        vectorised per bucket over the options' cost curves (the same choice: the
        first fastest option, None where none fits)."""
        view = self.view
        out: list[BucketOption | None] = [None] * len(items)
        rows: dict[int, list[int]] = {}
        for n, item in enumerate(items):
            if item.mixed or (item.count == 1 and not view.uniform[item.bucket]):
                out[n] = self.item_option(item, sp)[0]
            else:
                rows.setdefault(item.bucket, []).append(n)
        for b, ns in rows.items():
            options = self.options_at(b, sp)
            if not options:
                continue
            units = np.asarray(
                [self.count_of(b, items[n].count, items[n].tokens) for n in ns], dtype=float
            )
            times = np.stack([cfg.times_for(units) for cfg in options])
            best = np.argmin(times, axis=0)
            found = np.isfinite(times[best, np.arange(len(ns))])
            for n, k, ok in zip(ns, best.tolist(), found.tolist()):
                out[n] = options[k] if ok else None
        return out

    def micro_batch_recompute(self, item: Item, sp: int, cfg: BucketOption) -> tuple[bool, ...]:
        """The recomputation ``item`` runs under option ``cfg`` on ``sp`` ranks: the
        option's own, or with :attr:`per_micro_batch` for a single sample of a text
        bucket or a mixed micro-batch, the faster of it and the planner's choice
        (:func:`~datacentric.planning.planner.choose_recompute`) for the item's own
        samples under the cap."""
        own = self._own(item, sp, cfg)
        return cfg.recompute if own is None else own[0]

    def _own(self, item: Item, sp: int, cfg: BucketOption) -> tuple[tuple[bool, ...], float] | None:
        """The per-micro-batch choice of :meth:`micro_batch_recompute` and its time
        (None: the option's own applies)."""
        single = item.count == 1 and not self.view.uniform[item.bucket]
        if not self.per_micro_batch or not (single or (item.mixed and self.mixed_knapsack)):
            return None
        if single and not any(cfg.recompute):  # a shorter sample needs no more: nothing to gain
            return None
        shapes = tuple(self.view.shapes[i] for i in item.ids)
        key = (shapes, sp, cfg.ring_size)
        if key not in self._own_choice:
            choice = choose_recompute(self.cost_model, list(shapes), sp, self.cap, cfg.ring_size)
            self._own_choice[key] = None if choice is None else (choice.recompute, choice.time_s)
        found = self._own_choice[key]
        if found is None:
            return None
        planned = self.view.exact_time(self.cost_model, item.ids, sp, cfg.recompute, cfg.ring_size)
        if item.mixed and not self.fits(item.ids, sp, cfg.recompute, cfg.ring_size):
            planned = float("inf")
        return found if found[1] < planned else None

    def _time_with(self, item: Item, sp: int, cfg: BucketOption) -> float:
        """Estimated time of ``item`` on ``sp`` ranks under option ``cfg``."""
        ring = cfg.ring_size
        own = self._own(item, sp, cfg)
        if own is not None:
            return own[1]
        if item.count == 1 and not self.view.uniform[item.bucket]:
            return self.view.exact_time(self.cost_model, item.ids, sp, cfg.recompute, ring)
        if item.mixed:
            if not self.fits(item.ids, sp, cfg.recompute, ring):
                return float("inf")
            return self.view.exact_time(self.cost_model, item.ids, sp, cfg.recompute, ring)
        units = self.count_of(item.bucket, item.count, item.tokens)
        if units > cfg.max_batch:
            return float("inf")
        return cfg.time(units)

    def times_for(self, b: int, sp: int, units: np.ndarray) -> np.ndarray:
        """Per entry of ``units`` (representatives per micro-batch of bucket ``b``), the
        fastest admitted option's time on ``sp`` ranks (infinity where none fits)."""
        out = np.full(len(units), np.inf)
        for cfg in self.options_at(b, sp):
            out = np.minimum(out, cfg.times_for(units))
        return out

    def estimates(
        self, settings: Sequence[tuple[Item, int, tuple[bool, ...]] | tuple[Item, int, tuple, int]]
    ) -> list[float]:
        """The times ``MicroBatch.est_time_s`` carries for ``(item, sp, recompute)`` or
        ``(item, sp, recompute, ring)`` (ring degree, default 1):
        the cost model's own answer on the item's samples or, with ``exact_estimates``
        off, the bucket curve's for multi-sample micro-batches of one text bucket
        (vectorised per bucket and SP size)."""
        view = self.view
        out = [0.0] * len(settings)
        curve: dict[tuple[int, int, tuple[bool, ...], int], list[int]] = {}
        uniform: dict[tuple, float] = {}
        sums: list[tuple | None] = [None] * len(settings)
        if view.keys_by_sums(self.cost_model):  # the keys' sums in one pass
            sums = view.batch_sums([setting[0].ids for setting in settings])
        for n, setting in enumerate(settings):
            item, sp, rc = setting[:3]
            ring = int(setting[3]) if len(setting) > 3 else 1
            if view.uniform[item.bucket] and not item.mixed:  # one shape: memoise by count
                key = (item.bucket, item.count, sp, rc, ring)
                t = uniform.get(key)
                if t is None:
                    t = uniform[key] = view.exact_time(self.cost_model, item.ids, sp, rc, ring)
                out[n] = t
                continue
            cfg = None
            if not (self.exact_estimates or view.uniform[item.bucket] or item.mixed):
                cfg = self.option_with(item.bucket, sp, rc, ring) if item.count > 1 else None
            if cfg is not None:
                curve.setdefault((item.bucket, sp, rc, ring), []).append(n)
            else:
                out[n] = view.exact_time(self.cost_model, item.ids, sp, rc, ring, sums[n])
        for (b, sp, rc, ring), rows in curve.items():
            units = [settings[n][0].tokens / view.rep_tokens(b) for n in rows]
            cfg = self.option_with(b, sp, rc, ring)
            for n, t in zip(rows, cfg.times_for(np.asarray(units)).tolist()):
                out[n] = t
        return out
