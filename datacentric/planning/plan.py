"""Plans: per bucket, the settings the planner chose and every feasible option.

A :class:`Plan` is the one authority on how a bucket may run: its memory cap (bytes,
resolved once) and, per bucket, the planner's choice (:class:`BucketPlan`) and the
options policies choose among (:class:`~datacentric.planning.bucket_options.BucketOption`:
SP size, recomputation, largest micro-batch and the time curve).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datacentric.planning.bucket_options import BucketOption
from datacentric.shapes import SampleShape

#: Largest micro-batch an option may have unless the planner is told otherwise.
OPTION_BATCH_LIMIT = 4096


class PlanWithoutOptionsError(ValueError):
    """A plan that lacks a bucket's options (saved before plans carried them, or made
    for other data): it cannot drive a schedule."""

    def __init__(self, bucket: str) -> None:
        super().__init__(
            f"the plan has no options for bucket {bucket!r} (made for other data, or saved "
            "by an older version without bucket options); plan the dataset again"
        )


@dataclass(frozen=True)
class BucketPlan:
    """Settings for one bucket: its micro-batches of ``micro_batch_size`` samples run
    on groups of ``sp_size`` ranks with per-block ``recompute``; ``options`` are every
    (SP size, recomputation) it may run with under the plan's cap."""

    bucket: str
    shape: SampleShape
    sp_size: int
    micro_batch_size: int
    recompute: tuple[bool, ...]
    est_time_s: float
    est_memory_bytes: int
    options: tuple[BucketOption, ...] = ()

    @property
    def samples_per_gpu_second(self) -> float:
        """Throughput per GPU: ``micro_batch_size / (sp_size * est_time_s)``."""
        if self.est_time_s <= 0:
            return float("inf")
        return self.micro_batch_size / (self.sp_size * self.est_time_s)

    def to_json(self, *, with_options: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bucket": self.bucket,
            "shape": self.shape.to_json(),
            "sp_size": self.sp_size,
            "micro_batch_size": self.micro_batch_size,
            "recompute": "".join("1" if r else "0" for r in self.recompute),
            "num_recomputed": sum(self.recompute),
            "est_time_s": self.est_time_s,
            "est_memory_bytes": self.est_memory_bytes,
        }
        if with_options:
            out["options"] = [o.to_json() for o in self.options]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BucketPlan:
        return cls(
            bucket=str(d["bucket"]),
            shape=SampleShape.from_json(d["shape"]),
            sp_size=int(d["sp_size"]),
            micro_batch_size=int(d["micro_batch_size"]),
            recompute=tuple(c == "1" for c in d["recompute"]),
            est_time_s=float(d["est_time_s"]),
            est_memory_bytes=int(d["est_memory_bytes"]),
            options=tuple(BucketOption.from_json(o) for o in d.get("options", ())),
        )


@dataclass(frozen=True)
class Plan:
    """Bucket plans keyed by bucket name, with the cap and world they were made for.

    ``skipped`` maps bucket names the user explicitly allowed to skip (they fit no
    configuration) to the number of samples left out. ``option_batch_limit`` is the
    largest micro-batch the options were searched up to.
    """

    buckets: dict[str, BucketPlan]
    memory_cap_bytes: int
    world_size: int
    num_blocks: int
    skipped: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    option_batch_limit: int = OPTION_BATCH_LIMIT

    def options_of(self, bucket: str) -> tuple[BucketOption, ...]:
        """The options of ``bucket``; raises :class:`PlanWithoutOptionsError` when the
        plan has none for it."""
        plan = self.buckets.get(bucket)
        if plan is None or not plan.options:
            raise PlanWithoutOptionsError(bucket)
        return plan.options

    def to_json(self) -> dict[str, Any]:
        return {
            "memory_cap_bytes": self.memory_cap_bytes,
            "world_size": self.world_size,
            "num_blocks": self.num_blocks,
            "option_batch_limit": self.option_batch_limit,
            "buckets": [b.to_json() for b in self.buckets.values()],
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
            option_batch_limit=int(d.get("option_batch_limit", OPTION_BATCH_LIMIT)),
        )
