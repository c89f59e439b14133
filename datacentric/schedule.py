"""The schedule as plain data.

Everything upstream (planner, scheduler policies) produces these objects and two
executors consume them unchanged: the runtime on real ranks and the simulator on
modelled hardware. They are frozen dataclasses that round-trip through JSON.

Vocabulary:
- a **micro-batch** is one forward+backward pass over a few samples on one group;
- an **assignment** gives one aligned, contiguous block of ranks (an SP group of
  ``sp_size`` ranks starting at ``rank_start``) an ordered list of micro-batches in
  one ``phase`` of the step;
- an **iteration** is one optimizer step: in each of its phases, assignments that
  cover every rank once. Most steps have one phase (one group layout); a step of
  several phases changes its layout between them (Megatron-Core's dynamic CP re-forms
  its groups per micro-batch), each rank running its phases in order, a group starting
  once all its ranks are done with the phase before (:func:`phase_timeline`). A rank's
  gradient-accumulation count is its micro-batches over all phases;
- a **schedule** is an epoch of iterations over a dataset of ``num_samples``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from datacentric.regular_files import open_regular

__all__ = ["Assignment", "Iteration", "MicroBatch", "Schedule", "phase_timeline"]


@dataclass(frozen=True)
class MicroBatch:
    """One forward+backward pass of a group.

    ``recompute[i]`` says whether block ``i`` recomputes its activations in
    backward (activation checkpointing); an empty tuple means no block does.
    ``packed`` micro-batches concatenate their samples into one variable-length
    sequence; otherwise samples are separate sequences of one bucket.
    ``est_time_s`` is the planner's estimate of the pass on its group (0 if unknown).
    ``ring_size`` is the pass's ring degree within its group: the group's ``sp_size``
    ranks run Ulysses over ``sp_size / ring_size`` adjacent ranks inside an attention
    ring of ``ring_size`` positions (1: Ulysses only; ``sp_size``: ring only).
    """

    sample_ids: tuple[int, ...]
    bucket: str
    tokens: int
    recompute: tuple[bool, ...] = ()
    est_time_s: float = 0.0
    packed: bool = False
    ring_size: int = 1

    def __post_init__(self) -> None:
        if not self.sample_ids:
            raise ValueError(f"micro-batch of bucket {self.bucket!r} has no samples")
        if self.ring_size < 1:
            raise ValueError(f"micro-batch of bucket {self.bucket!r}: ring size {self.ring_size}")

    @property
    def num_recomputed(self) -> int:
        return sum(self.recompute)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "samples": list(self.sample_ids),
            "bucket": self.bucket,
            "tokens": self.tokens,
        }
        if self.recompute:
            out["recompute"] = "".join("1" if r else "0" for r in self.recompute)
        if self.est_time_s:
            out["est_time_s"] = self.est_time_s
        if self.packed:
            out["packed"] = True
        if self.ring_size > 1:
            out["ring"] = self.ring_size
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MicroBatch:
        return cls(
            sample_ids=tuple(int(i) for i in d["samples"]),
            bucket=str(d["bucket"]),
            tokens=int(d["tokens"]),
            recompute=tuple(c == "1" for c in d.get("recompute", "")),
            est_time_s=float(d.get("est_time_s", 0.0)),
            packed=bool(d.get("packed", False)),
            ring_size=int(d.get("ring", 1)),
        )


@dataclass(frozen=True)
class Assignment:
    """An SP group (ranks ``rank_start .. rank_start+sp_size-1``) and its micro-batches."""

    rank_start: int
    sp_size: int
    micro_batches: tuple[MicroBatch, ...]
    phase: int = 0

    def __post_init__(self) -> None:
        if self.phase < 0:
            raise ValueError(f"group at rank {self.rank_start}: phase {self.phase} is negative")
        if self.sp_size < 1 or self.rank_start < 0:
            raise ValueError(
                f"bad group: rank_start={self.rank_start}, sp_size={self.sp_size} "
                "(need rank_start >= 0 and sp_size >= 1)"
            )
        if self.rank_start % self.sp_size:
            raise ValueError(
                f"group at rank {self.rank_start} of size {self.sp_size} is not aligned: "
                "rank_start must be a multiple of sp_size"
            )
        if not self.micro_batches:
            raise ValueError(
                f"group at rank {self.rank_start} has no micro-batch; every rank must run at "
                "least one pass per iteration (the gradient reduction is collective)"
            )
        for mb in self.micro_batches:
            if self.sp_size % mb.ring_size:
                raise ValueError(
                    f"group at rank {self.rank_start} of size {self.sp_size}: a micro-batch "
                    f"with ring size {mb.ring_size}, which does not divide the group size"
                )

    @property
    def ranks(self) -> range:
        return range(self.rank_start, self.rank_start + self.sp_size)

    @property
    def accumulation_steps(self) -> int:
        return len(self.micro_batches)

    @property
    def splits(self) -> tuple[tuple[int, int], ...]:
        """``(Ulysses degree, ring degree)`` of each micro-batch, in order."""
        return tuple((self.sp_size // mb.ring_size, mb.ring_size) for mb in self.micro_batches)

    @property
    def est_time_s(self) -> float:
        return sum(mb.est_time_s for mb in self.micro_batches)

    def sample_ids(self) -> Iterator[int]:
        for mb in self.micro_batches:
            yield from mb.sample_ids

    def to_json(self) -> dict[str, Any]:
        return {
            "rank_start": self.rank_start,
            "sp_size": self.sp_size,
            "micro_batches": [mb.to_json() for mb in self.micro_batches],
            **({"phase": self.phase} if self.phase else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Assignment:
        return cls(
            rank_start=int(d["rank_start"]),
            sp_size=int(d["sp_size"]),
            micro_batches=tuple(MicroBatch.from_json(m) for m in d["micro_batches"]),
            phase=int(d.get("phase", 0)),
        )


@dataclass(frozen=True)
class Iteration:
    """One optimizer step: in each phase, groups that together cover every rank exactly
    once (see the module doc)."""

    index: int
    assignments: tuple[Assignment, ...]

    @property
    def num_phases(self) -> int:
        return 1 + max((a.phase for a in self.assignments), default=0)

    def validate(self, world_size: int) -> None:
        """Raise ``ValueError`` unless each phase's groups tile ``range(world_size)``
        exactly."""
        phases = self.num_phases
        where = f"iteration {self.index}"
        for phase in range(phases):
            at = f"{where}, phase {phase}" if phases > 1 else where
            covered = [False] * world_size
            for a in self.assignments:
                if a.phase != phase:
                    continue
                for r in a.ranks:
                    if r >= world_size:
                        raise ValueError(
                            f"{at}: group at rank {a.rank_start} of size {a.sp_size} runs past "
                            f"world size {world_size}"
                        )
                    if covered[r]:
                        raise ValueError(f"{at}: rank {r} is in two groups")
                    covered[r] = True
            missing = [r for r, c in enumerate(covered) if not c]
            if missing:
                raise ValueError(f"{at}: ranks {missing} have no group")

    def assignments_for_rank(self, rank: int) -> list[Assignment]:
        """The groups ``rank`` runs in, one per phase, in phase order."""
        found = sorted(
            (a for a in self.assignments if a.rank_start <= rank < a.rank_start + a.sp_size),
            key=lambda a: a.phase,
        )
        if not found:
            raise KeyError(f"iteration {self.index}: no group holds rank {rank}")
        return found

    def micro_batches_of_rank(self, rank: int) -> list[tuple[Assignment, MicroBatch]]:
        """``rank``'s micro-batches in the order it runs them, each with its group."""
        return [(a, mb) for a in self.assignments_for_rank(rank) for mb in a.micro_batches]

    def sample_ids(self) -> list[int]:
        return [i for a in self.assignments for i in a.sample_ids()]

    @property
    def num_tokens(self) -> int:
        return sum(mb.tokens for a in self.assignments for mb in a.micro_batches)

    @property
    def est_makespan_s(self) -> float:
        """When the last group ends, by the micro-batches' estimates."""
        return max(end for _, _, end in phase_timeline(self, lambda a: a.est_time_s))

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "assignments": [a.to_json() for a in self.assignments]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Iteration:
        return cls(
            index=int(d["index"]),
            assignments=tuple(Assignment.from_json(a) for a in d["assignments"]),
        )


@dataclass(frozen=True)
class Schedule:
    """An epoch: iterations over a dataset of ``num_samples`` samples (ids ``0..n-1``).

    ``dropped_sample_ids`` lists samples the user explicitly asked to leave out
    (a remainder, or buckets that fit no configuration); every other id appears in
    exactly one micro-batch. ``meta`` holds free-form, JSON-able facts (plan summary,
    measures) that executors may ignore.
    """

    world_size: int
    policy: str
    seed: int
    epoch: int
    num_samples: int
    iterations: tuple[Iteration, ...]
    dropped_sample_ids: tuple[int, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    memory_cap_bytes: int | None = None
    """The memory budget per rank the schedule was made under, copied from its plan
    (``Plan.memory_cap_bytes``): the simulator checks every micro-batch against it.
    ``None``: a schedule made by hand, without a plan."""

    def validate(self) -> None:
        """Check group tiling and that every sample id is scheduled or dropped exactly once."""
        seen = [0] * self.num_samples
        for it in self.iterations:
            it.validate(self.world_size)
            for i in it.sample_ids():
                _count(seen, i, f"iteration {it.index}")
        for i in self.dropped_sample_ids:
            _count(seen, i, "the dropped list")
        missing = [i for i, c in enumerate(seen) if c == 0]
        if missing:
            raise ValueError(
                f"{len(missing)} samples are neither scheduled nor dropped "
                f"(first ids: {missing[:10]})"
            )

    @property
    def samples_scheduled(self) -> int:
        return sum(
            len(mb.sample_ids)
            for it in self.iterations
            for a in it.assignments
            for mb in a.micro_batches
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "policy": self.policy,
            "seed": self.seed,
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "dropped_sample_ids": list(self.dropped_sample_ids),
            "memory_cap_bytes": self.memory_cap_bytes,
            "meta": self.meta,
            "iterations": [it.to_json() for it in self.iterations],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            world_size=int(d["world_size"]),
            policy=str(d["policy"]),
            seed=int(d["seed"]),
            epoch=int(d["epoch"]),
            num_samples=int(d["num_samples"]),
            iterations=tuple(Iteration.from_json(i) for i in d["iterations"]),
            dropped_sample_ids=tuple(int(i) for i in d.get("dropped_sample_ids", ())),
            meta=dict(d.get("meta", {})),
            # files written before the field existed kept the plan's cap in ``meta``
            memory_cap_bytes=d.get("memory_cap_bytes", d.get("meta", {}).get("memory_cap_bytes")),
        )

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_json(), handle)

    @classmethod
    def load(cls, path: str) -> Schedule:
        with open_regular(path) as handle:  # a FIFO in a run folder must not block
            return cls.from_json(json.load(handle))


def phase_timeline(
    iteration: Iteration, seconds: Callable[[Assignment], float]
) -> list[tuple[Assignment, float, float]]:
    """``(group, start, end)`` of every group of ``iteration``, from the step's start,
    when a group runs for ``seconds(group)``: phase by phase, each group starting once
    every one of its ranks has finished the phase before (the one timing rule of phases,
    for estimates and for the simulator)."""
    ready: dict[int, float] = {}
    out = []
    for a in sorted(iteration.assignments, key=lambda a: a.phase):
        start = max((ready.get(r, 0.0) for r in a.ranks), default=0.0)
        end = start + seconds(a)
        for r in a.ranks:
            ready[r] = end
        out.append((a, start, end))
    return out


def _count(seen: list[int], sample_id: int, where: str) -> None:
    if not 0 <= sample_id < len(seen):
        raise ValueError(f"{where}: sample id {sample_id} is outside 0..{len(seen) - 1}")
    if seen[sample_id]:
        raise ValueError(f"{where}: sample id {sample_id} is scheduled twice")
    seen[sample_id] = 1


def group_sizes(world_size: int) -> list[int]:
    """SP group sizes available at ``world_size``: every divisor, ascending."""
    return [s for s in range(1, world_size + 1) if world_size % s == 0]


def aligned_groups(world_size: int) -> list[tuple[int, int]]:
    """Every aligned contiguous rank block ``(rank_start, size)`` whose size divides the world."""
    return [(start, s) for s in group_sizes(world_size) for start in range(0, world_size, s)]


def uniform_iteration(
    index: int, world_size: int, sp_size: int, per_group: Sequence[Sequence[MicroBatch]]
) -> Iteration:
    """An iteration of equal groups of ``sp_size``; ``per_group[g]`` feeds group ``g``."""
    if world_size % sp_size:
        raise ValueError(f"sp_size {sp_size} does not divide world size {world_size}")
    if len(per_group) != world_size // sp_size:
        raise ValueError(
            f"{len(per_group)} micro-batch lists for {world_size // sp_size} groups of {sp_size}"
        )
    return Iteration(
        index=index,
        assignments=tuple(
            Assignment(rank_start=g * sp_size, sp_size=sp_size, micro_batches=tuple(mbs))
            for g, mbs in enumerate(per_group)
        ),
    )
