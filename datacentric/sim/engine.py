"""The execution model: run a :class:`~datacentric.schedule.Schedule` on modelled hardware.

For every iteration, every group (an assignment: ``sp_size`` ranks starting at
``rank_start``) runs its micro-batches back to back, all ranks of the group in lock
step (Ulysses all-to-all synchronises them inside every attention layer); in a step
of several phases, a group starts once all its ranks are done with the phase before
(:func:`~datacentric.schedule.phase_timeline`). A
micro-batch's duration is the ``time_s`` of the cost model's ``breakdown`` for its
sample shapes, SP size and recomputation, *re-derived from the dataset's shapes*
(``MicroBatch.est_time_s`` and ``MicroBatch.tokens`` are never trusted): forward,
backward, recomputation of the blocks that recompute, and the group's all-to-all,
whose cost the model charges by group size and by whether the group spans more
than ``gpus_per_node`` ranks.

Once per iteration the world reduces gradients. By default the engine trusts the
cost model: ``grad_sync_time_s`` is the part *not* hidden behind backward, added
after the slowest group. With ``overlap_grad_sync=True`` the engine models the
overlap itself and takes ``grad_sync_time_s`` as the *whole* reduction: as in DDP
and ZeRO-2, gradient buckets are reduced as soon as they are final on every rank,
so the reduction runs behind the backward of the last micro-batch of the group
that finishes last (ranks of faster groups are already waiting), and only
``max(0, reduction - that backward)`` is exposed. A pass's backward is taken as
its time minus its forward, the forward being a third of the pass without
recomputation (the usual 1:2 forward:backward FLOP ratio; approximate). The rule is
the scheduler's (:func:`~datacentric.scheduling.measures.exposed_grad_sync_s`), so
``schedule``'s estimate and the simulation charge the sync alike.

Every micro-batch is checked against the schedule's memory budget (``Schedule.memory_cap_bytes``,
copied from its plan, see :func:`schedule_memory_cap`): a schedule that
would not fit raises :class:`PlanDoesNotFitError` naming the iteration, the group
and the micro-batch, instead of returning an optimistic number.

With ``record_spans`` the result holds the timing records the runtime also
produces (:class:`~datacentric.timing.Span`): per rank and micro-batch, compute,
recompute and all-to-all spans; per rank and iteration, the exposed gradient sync.

Measures:
- *idle share* of an iteration: the GPU time ranks spend waiting for the slowest
  group, over ``world_size x makespan`` (makespan before the gradient reduction);
  the epoch's idle share weights iterations by their makespan;
- *tokens per second*: the dataset tokens scheduled over the epoch time;
- *efficiency*: the ideal epoch time (the scheduler's bound) over the simulated one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datacentric.planning.cost_model import CostModel, PassBreakdown, split_breakdown
from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule, phase_timeline
from datacentric.scheduling.measures import backward_s, exposed_grad_sync_s
from datacentric.shapes import SampleShape
from datacentric.timing import COMM, COMPUTE, RECOMPUTE, SYNC, Span, micro_batch_id


class PlanDoesNotFitError(ValueError):
    """A micro-batch of the schedule needs more memory than the device has."""


@dataclass(frozen=True)
class MicroBatchRun:
    """What one micro-batch of a result was (its timing is in the result's spans)."""

    id: int
    """Its :func:`~datacentric.timing.micro_batch_id`."""
    iteration: int
    rank_start: int
    sp_size: int
    bucket: str
    samples: int
    tokens: int
    memory_bytes: int
    """Modelled peak bytes on one rank (0 when measured)."""

    @property
    def ranks(self) -> range:
        return range(self.rank_start, self.rank_start + self.sp_size)

    @classmethod
    def of(cls, iteration: int, group: Assignment, mb: MicroBatch, **facts: int) -> MicroBatchRun:
        """The record of ``mb`` of ``group``; ``facts`` override ``tokens``/``memory_bytes``."""
        return cls(
            id=micro_batch_id(mb),
            iteration=iteration,
            rank_start=group.rank_start,
            sp_size=group.sp_size,
            bucket=mb.bucket,
            samples=len(mb.sample_ids),
            tokens=facts.get("tokens", mb.tokens),
            memory_bytes=facts.get("memory_bytes", 0),
        )


@dataclass(frozen=True)
class IterationResult:
    """Timing of one iteration."""

    index: int
    start_s: float
    makespan_s: float
    """Time until the slowest group finishes its last micro-batch."""
    grad_sync_s: float
    """Exposed gradient all-reduce after the makespan."""
    idle_share: float
    tokens: int

    @property
    def time_s(self) -> float:
        return self.makespan_s + self.grad_sync_s


@dataclass(frozen=True)
class SimResult:
    """Outcome of simulating one schedule."""

    policy: str
    world_size: int
    iterations: tuple[IterationResult, ...]
    tokens: int
    samples: int
    busy_gpu_s: float
    """Sum over ranks of the time spent in micro-batches."""
    recompute_gpu_s: float
    comm_gpu_s: float
    ideal_epoch_time_s: float | None = None
    spans: tuple[Span, ...] = field(default=(), repr=False)
    """Every rank's timing records, in seconds from the start of the epoch."""
    micro_batches: Mapping[int, MicroBatchRun] = field(default_factory=dict, repr=False)
    """The micro-batches the spans name, by id."""
    device: str = "gpu"
    """What the ranks are: ``gpu`` (simulated), ``cpu`` or ``cuda`` (measured)."""

    @property
    def epoch_time_s(self) -> float:
        return sum(it.time_s for it in self.iterations)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.epoch_time_s

    @property
    def idle_share(self) -> float:
        """Idle GPU time over all GPU time before the gradient reductions (epoch-level)."""
        total = self.world_size * sum(it.makespan_s for it in self.iterations)
        return 1.0 - self.busy_gpu_s / total

    @property
    def idle_share_per_iteration(self) -> list[float]:
        return [it.idle_share for it in self.iterations]

    @property
    def efficiency(self) -> float | None:
        if self.ideal_epoch_time_s is None:
            return None
        return self.ideal_epoch_time_s / self.epoch_time_s

    def summary(self) -> dict[str, Any]:
        """JSON-able headline numbers."""
        grad = sum(it.grad_sync_s for it in self.iterations)
        return {
            "policy": self.policy,
            "world_size": self.world_size,
            "iterations": len(self.iterations),
            "samples": self.samples,
            "tokens": self.tokens,
            "epoch_time_s": self.epoch_time_s,
            "tokens_per_s": self.tokens_per_s,
            "idle_share": self.idle_share,
            "idle_share_mean_per_iteration": (
                sum(self.idle_share_per_iteration) / len(self.iterations)
            ),
            "efficiency": self.efficiency,
            "ideal_epoch_time_s": self.ideal_epoch_time_s,
            "recompute_share": self.recompute_gpu_s / self.busy_gpu_s,
            "comm_share": self.comm_gpu_s / self.busy_gpu_s,
            "grad_sync_share": grad / self.epoch_time_s,
        }


def schedule_memory_cap(schedule: Schedule) -> int:
    """The memory budget a schedule is checked against: its own, copied from the plan
    it was made with (cost models hold none)."""
    if schedule.memory_cap_bytes is None:
        raise ValueError(
            "the schedule carries no memory budget (made by hand, or saved by an older "
            "version): set Schedule.memory_cap_bytes, or build it again from a plan"
        )
    return int(schedule.memory_cap_bytes)


def simulate(
    schedule: Schedule,
    shapes: Sequence[SampleShape],
    cost_model: CostModel,
    *,
    ideal_epoch_time_s: float | None = None,
    record_spans: bool = True,
    overlap_grad_sync: bool = False,
) -> SimResult:
    """Execute ``schedule`` over the dataset ``shapes`` on ``cost_model``'s hardware.

    ``ideal_epoch_time_s`` (the scheduler's bound for the same dataset and world)
    makes the result report an efficiency. Pass costs are the cost model's cached
    :meth:`~datacentric.planning.cost_model.CostModel.breakdown`. ``overlap_grad_sync``: model the
    gradient reduction's overlap with the last backward here (see the module doc);
    the cost model's ``grad_sync_time_s`` must then be the whole reduction.
    """
    if len(shapes) != schedule.num_samples:
        raise ValueError(
            f"the schedule is over {schedule.num_samples} samples but {len(shapes)} shapes "
            "were given"
        )
    schedule.validate()
    run = _Run(
        shapes=shapes,
        cost_model=cost_model,
        capacity=schedule_memory_cap(schedule),
        reduction_s=cost_model.grad_sync_time_s(schedule.world_size),
        world=schedule.world_size,
        record_spans=record_spans,
        overlap_grad_sync=overlap_grad_sync,
    )
    for it in schedule.iterations:
        run.iteration(it)
    if not run.iterations:
        raise ValueError("the schedule has no iterations: nothing to simulate")
    return SimResult(
        policy=schedule.policy,
        world_size=run.world,
        iterations=tuple(run.iterations),
        tokens=run.tokens,
        samples=run.samples,
        busy_gpu_s=run.busy,
        recompute_gpu_s=run.recompute_gpu,
        comm_gpu_s=run.comm_gpu,
        ideal_epoch_time_s=ideal_epoch_time_s,
        spans=tuple(run.spans),
        micro_batches=run.runs,
    )


@dataclass
class _Run:
    """One simulation's inputs and running totals: iterations run one after another on
    the clock, each group's micro-batches back to back (:meth:`group`)."""

    shapes: Sequence[SampleShape]
    cost_model: CostModel
    capacity: int
    reduction_s: float
    world: int
    record_spans: bool
    overlap_grad_sync: bool
    iterations: list[IterationResult] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    runs: dict[int, MicroBatchRun] = field(default_factory=dict)
    clock: float = 0
    tokens: int = 0
    samples: int = 0
    busy: float = 0.0
    recompute_gpu: float = 0.0
    comm_gpu: float = 0.0

    def iteration(self, it: Iteration) -> None:
        """Run one iteration: its groups phase by phase, then the gradient sync."""
        group_runs = {id(group): self.group(it.index, group) for group in it.assignments}
        it_tokens = sum(run[3] for run in group_runs.values())
        totals = {key: run[0] for key, run in group_runs.items()}
        timeline = phase_timeline(it, lambda g, totals=totals: totals[id(g)])
        makespan = max(end for _, _, end in timeline)
        it_busy = sum(g.sp_size * (end - start) for g, start, end in timeline)
        clock, world = self.clock, self.world
        if self.record_spans:
            for g, start, _ in timeline:
                for run_id, at, cost in group_runs[id(g)][2]:
                    self.spans.extend(_pass_spans(it.index, g, run_id, clock + start + at, cost))
        window = None
        if self.overlap_grad_sync:
            window = min(group_runs[id(g)][1] for g, _, end in timeline if end == makespan)
        grad_sync_s = exposed_grad_sync_s(self.reduction_s, window)
        idle = 1.0 - it_busy / (world * makespan) if makespan > 0 else 0.0
        self.iterations.append(
            IterationResult(it.index, clock, makespan, grad_sync_s, idle, it_tokens)
        )
        if self.record_spans:
            self.spans.extend(
                Span(r, it.index, SYNC, clock + makespan, grad_sync_s) for r in range(world)
            )
        self.busy += it_busy
        self.tokens += it_tokens
        self.clock = clock + makespan + grad_sync_s

    def group(self, iteration: int, group: Assignment) -> tuple[float, float, list, int]:
        """One group's micro-batches back to back: its time, its last backward, its
        passes (micro-batch id, start, cost) and its tokens; refuses a micro-batch over
        the schedule's memory budget."""
        t = last_backward = 0.0
        passes = []
        tokens = 0
        for k, mb in enumerate(group.micro_batches):
            mb_shapes = [self.shapes[i] for i in mb.sample_ids]
            recompute = mb.recompute or (False,) * self.cost_model.num_blocks
            cost = split_breakdown(
                self.cost_model, mb_shapes, group.sp_size, recompute, mb.ring_size
            )
            if cost.memory_bytes > self.capacity:
                raise PlanDoesNotFitError(
                    _does_not_fit(iteration, group, k, mb, cost, self.capacity)
                )
            mb_tokens = sum(s.tokens for s in mb_shapes)
            if self.record_spans:
                run = MicroBatchRun.of(
                    iteration, group, mb, tokens=mb_tokens, memory_bytes=cost.memory_bytes
                )
                self.runs[run.id] = run
                passes.append((run.id, t, cost))
            t += cost.time_s
            last_backward = backward_s(cost)
            tokens += mb_tokens
            self.samples += len(mb.sample_ids)
            self.recompute_gpu += cost.recompute_s * group.sp_size
            self.comm_gpu += cost.comm_s * group.sp_size
        return t, last_backward, passes, tokens


def _pass_spans(
    iteration: int, group: Assignment, mb_id: int, start_s: float, cost: PassBreakdown
) -> list[Span]:
    """A modelled pass on every rank of its group: compute, then the recomputation, then
    the all-to-all (in reality both are spread over the layers; the model knows totals)."""
    compute_s = max(0.0, cost.compute_s)
    parts = [(COMPUTE, compute_s), (RECOMPUTE, cost.recompute_s), (COMM, cost.comm_s)]
    out = []
    for rank in group.ranks:
        t = start_s
        for kind, seconds in parts:
            if seconds > 0 or kind == COMPUTE:
                out.append(Span(rank, iteration, kind, t, seconds, mb_id))
            t += seconds
    return out


def _does_not_fit(
    iteration: int,
    group: Assignment,
    index: int,
    mb: MicroBatch,
    cost: PassBreakdown,
    capacity: int,
) -> str:
    last = group.rank_start + group.sp_size - 1
    return (
        f"iteration {iteration}, group of ranks {group.rank_start}..{last} (sp {group.sp_size}), "
        f"micro-batch {index} (bucket {mb.bucket!r}, {len(mb.sample_ids)} samples, "
        f"recompute {mb.num_recomputed} blocks) needs {cost.memory_bytes / 2**30:.2f} GiB per "
        f"rank, above the capacity of {capacity / 2**30:.2f} GiB: the plan does not fit"
    )
