"""Plans: per bucket, the settings the planner chose and every feasible option.

A :class:`Plan` is the one authority on how a bucket may run: its memory budget
(bytes, resolved once) and, per bucket (:class:`BucketPlan`), the options policies
choose among (:class:`~datacentric.planning.bucket_options.BucketOption`:
SP size, recomputation, largest micro-batch and the time curve).
:meth:`Plan.preferred` derives a bucket's best option on its own (the ``plan``
command's table and the profiler's validation cases read it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from datacentric.planning.bucket_options import BucketOption
from datacentric.planning.cost_model import split_breakdown
from datacentric.settings.scheduling import MAX_MICRO_BATCH_SIZE
from datacentric.shapes import SampleShape


class PlanWithoutOptionsError(ValueError):
    """A plan that lacks a bucket's options (saved before plans carried them, or made
    for other data): it cannot drive a schedule."""

    def __init__(self, bucket: str) -> None:
        super().__init__(
            f"the plan has no options for bucket {bucket!r} (made for other data, or saved "
            "by an older version without bucket options); plan the dataset again"
        )


@dataclass(frozen=True)
class BucketChoice:
    """One way to run a bucket with its micro-batch size: what
    :meth:`Plan.preferred` derives from the bucket's options."""

    sp_size: int
    micro_batch_size: int
    recompute: tuple[bool, ...]
    est_time_s: float
    """The option's time of ``micro_batch_size`` representatives (a measured point)."""
    ring_size: int = 1
    """The ring degree of the option's split (Ulysses over ``sp_size / ring_size``)."""

    @property
    def samples_per_gpu_second(self) -> float:
        """Throughput per GPU: ``micro_batch_size / (sp_size * est_time_s)``."""
        if self.est_time_s <= 0:
            return float("inf")
        return self.micro_batch_size / (self.sp_size * self.est_time_s)


def preferred_choice(options: tuple[BucketOption, ...]) -> BucketChoice:
    """The option and micro-batch size (one of each option's timed sizes ``1, 2, 4,
    ..., max_batch``) with the most samples per GPU-second; ties go to smaller groups,
    then fewer recomputed blocks, then smaller micro-batches."""
    best: BucketChoice | None = None
    for option in options:
        for count, seconds in zip(option.counts, option.times):
            choice = BucketChoice(
                option.sp_size, int(count), option.recompute, float(seconds), option.ring_size
            )
            if best is None or _preferred_over(choice, best):
                best = choice
    if best is None:
        raise ValueError("a bucket without options has no preferred choice")
    return best


def _preferred_over(a: BucketChoice, b: BucketChoice) -> bool:
    ra, rb = a.samples_per_gpu_second, b.samples_per_gpu_second
    if abs(ra - rb) > 1e-12 * max(ra, rb):
        return ra > rb
    key = (a.sp_size, sum(a.recompute), a.micro_batch_size)
    return key < (b.sp_size, sum(b.recompute), b.micro_batch_size)


_DEPRECATED_CHOICE = ("sp_size", "micro_batch_size", "recompute", "est_time_s")


@dataclass(frozen=True)
class BucketPlan:
    """One bucket of a plan: its representative ``shape`` and ``options``, every
    (SP size, recomputation) it may run with under the plan's budget. Which of them is
    best on its own is derived, :meth:`Plan.preferred`."""

    bucket: str
    shape: SampleShape
    options: tuple[BucketOption, ...] = ()

    def preferred(self) -> BucketChoice:
        """The option and micro-batch size with the most samples per GPU-second."""
        return preferred_choice(self.options)

    def __getattr__(self, name: str) -> Any:
        if name in _DEPRECATED_CHOICE or name == "samples_per_gpu_second":
            warnings.warn(
                f"BucketPlan.{name} is deprecated: use Plan.preferred(bucket).{name}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(self.preferred(), name)
        raise AttributeError(name)

    def to_json(self, *, with_options: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"bucket": self.bucket, "shape": self.shape.to_json()}
        if with_options:
            out["options"] = [o.to_json() for o in self.options]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BucketPlan:
        """Also reads plans saved with the planner's choice (those keys are derived now)."""
        return cls(
            bucket=str(d["bucket"]),
            shape=SampleShape.from_json(d["shape"]),
            options=tuple(BucketOption.from_json(o) for o in d.get("options", ())),
        )


@dataclass(frozen=True)
class Plan:
    """Bucket plans keyed by bucket name, with the cap and world they were made for.

    ``skipped`` maps bucket names the user explicitly allowed to skip (they fit no
    configuration) to the number of samples left out. ``option_batch_limit`` is the
    largest micro-batch the options were searched up to (the ``[scheduling]``
    ``max_micro_batch_size`` the plan was made under).
    """

    buckets: dict[str, BucketPlan]
    memory_cap_bytes: int
    world_size: int
    num_blocks: int
    skipped: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    option_batch_limit: int = MAX_MICRO_BATCH_SIZE
    price_memo: dict[int, tuple[Any, dict, dict]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """Per cost model (by id, the model kept to tell reused ids apart), the certified
    sample prices found so far under this plan's cap and their searches' guesses
    (:mod:`~datacentric.planning.sample_price`): one epoch's bound reuses the last's."""

    def prices_for(self, cost_model: Any) -> tuple[dict, dict]:
        """The price memo and the guesses of ``cost_model`` (see :attr:`price_memo`)."""
        entry = self.price_memo.get(id(cost_model))
        if entry is None or entry[0] is not cost_model:
            entry = self.price_memo[id(cost_model)] = (cost_model, {}, {})
        return entry[1], entry[2]

    def options_of(self, bucket: str) -> tuple[BucketOption, ...]:
        """The options of ``bucket``; raises :class:`PlanWithoutOptionsError` when the
        plan has none for it."""
        plan = self.buckets.get(bucket)
        if plan is None or not plan.options:
            raise PlanWithoutOptionsError(bucket)
        return plan.options

    def preferred(self, bucket: str) -> BucketChoice:
        """The option and micro-batch size of ``bucket`` with the most samples per
        GPU-second (derived from its options; policies choose for themselves)."""
        return preferred_choice(self.options_of(bucket))

    def bucket_row(
        self, bucket: str, cost_model: Any = None, *, with_options: bool = True
    ) -> dict[str, Any]:
        """``bucket``'s JSON with its preferred choice (derived, for readers: ignored
        by :meth:`from_json`), and that choice's memory per rank on ``cost_model``."""
        plan = self.buckets[bucket]
        row = plan.to_json(with_options=with_options)
        if not plan.options:
            return row
        best = plan.preferred()
        row.update(
            sp_size=best.sp_size,
            micro_batch_size=best.micro_batch_size,
            recompute="".join("1" if r else "0" for r in best.recompute),
            num_recomputed=sum(best.recompute),
            est_time_s=best.est_time_s,
            samples_per_gpu_second=best.samples_per_gpu_second,
        )
        if best.ring_size > 1:
            row["ring"] = best.ring_size
        if cost_model is not None:
            shapes = [plan.shape] * best.micro_batch_size
            cost = split_breakdown(cost_model, shapes, best.sp_size, best.recompute, best.ring_size)
            row["est_memory_bytes"] = int(cost.memory_bytes)
        return row

    def to_json(self, cost_model: Any = None) -> dict[str, Any]:
        """The plan as JSON; each bucket with :meth:`bucket_row`'s derived choice (and its
        memory on ``cost_model`` when given)."""
        return {
            "memory_cap_bytes": self.memory_cap_bytes,
            "world_size": self.world_size,
            "num_blocks": self.num_blocks,
            "option_batch_limit": self.option_batch_limit,
            "buckets": [self.bucket_row(name, cost_model) for name in self.buckets],
            "skipped": self.skipped,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        plans = [BucketPlan.from_json(b) for b in d["buckets"]]
        return cls(
            buckets={p.bucket: p for p in plans},
            memory_cap_bytes=int(d["memory_cap_bytes"]),
            world_size=int(d["world_size"]),
            num_blocks=int(d["num_blocks"]),
            skipped={str(k): int(v) for k, v in d.get("skipped", {}).items()},
            meta=dict(d.get("meta", {})),
            option_batch_limit=int(d.get("option_batch_limit", MAX_MICRO_BATCH_SIZE)),
        )
