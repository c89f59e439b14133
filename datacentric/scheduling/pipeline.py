"""The one planning pipeline: shapes -> plan -> each epoch's schedule.

A :class:`Pipeline` holds what planning and scheduling need (the dataset's shapes,
the cost model, the world, the memory budget and the ``[scheduling]`` options),
plans the buckets once (:attr:`Pipeline.plan`, the planner's) and builds any epoch's
schedule from that plan (:meth:`Pipeline.schedule`). It is pure: every rank, the
simulator, the commands and a separate process get the same plan and schedules from
the same inputs. Every caller builds one instead of calling ``plan_buckets`` and
``build_schedule`` with its own keyword lists: ``DataCentric``, the trainer, the
``schedule``/``simulate``/``plan``/``bench`` commands, the policy comparison and the
profiler's validation.

The budget (``memory_cap_bytes``) is resolved once by the caller, from the settings
and the device (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`); the
plan holds it and every schedule carries a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.planning.planner import plan_buckets
from datacentric.schedule import Schedule
from datacentric.scheduling.epoch import POLICIES, EpochStream
from datacentric.scheduling.measures import ideal_epoch_time
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import Bucketing, SampleShape, make_buckets


class Pipeline:
    """Plans ``shapes`` once and schedules each epoch (see the module doc).

    ``memory_cap_bytes``: the budget per rank (required unless ``plan`` is given, whose
    budget is then the one). ``policy``: the default policy of :meth:`schedule` (unset:
    the ``[scheduling]`` section's, ``options.policy``).
    ``options``: the ``[scheduling]`` section (its ``max_micro_batch_size`` is the one
    bound of the plan's micro-batches). ``sp_sizes``: the SP sizes the planner may use
    (default: every one the cost model supports). ``skip_unfittable``: leave out buckets that fit no
    configuration (reported in ``Plan.skipped``) instead of raising. ``plan``: a plan
    made before (a saved one) instead of the planner's.
    """

    def __init__(
        self,
        shapes: Sequence[SampleShape],
        cost_model: CostModel,
        *,
        world_size: int,
        memory_cap_bytes: int | None = None,
        policy: str | None = None,
        options: SchedulingConfig | None = None,
        seed: int = 0,
        sp_sizes: Sequence[int] | None = None,
        skip_unfittable: bool = False,
        plan: Plan | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.options = options or SchedulingConfig()
        policy = policy or self.options.policy
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if plan is None and memory_cap_bytes is None:
            raise ValueError(
                "a pipeline needs a memory budget: memory_cap_bytes (resolve_memory_cap of "
                "memory_gb and the device) or a plan"
            )
        if plan is not None and memory_cap_bytes not in (None, plan.memory_cap_bytes):
            raise ValueError(
                f"the plan was made under {plan.memory_cap_bytes} bytes per rank, not "
                f"{memory_cap_bytes}: plan again, or leave the budget to the plan"
            )
        self.shapes = list(shapes)
        self.cost_model = cost_model
        self.world_size = int(world_size)
        self.policy = policy
        self.seed = int(seed)
        self.sp_sizes = None if sp_sizes is None else list(sp_sizes)
        self.skip_unfittable = skip_unfittable
        self._budget = memory_cap_bytes
        if plan is not None:
            self.__dict__["plan"] = plan

    @cached_property
    def bucketing(self) -> Bucketing:
        """The dataset's buckets (:func:`~datacentric.shapes.make_buckets`)."""
        return make_buckets(self.shapes)

    @cached_property
    def plan(self) -> Plan:
        """The planner's plan of every bucket under the budget (made once)."""
        return plan_buckets(
            self.bucketing,
            self.cost_model,
            world_size=self.world_size,
            memory_cap_bytes=self._budget,
            sp_sizes=self.sp_sizes,
            skip_unfittable=self.skip_unfittable,
            max_micro_batch_size=self.options.max_micro_batch_size,
        )

    @property
    def memory_cap_bytes(self) -> int:
        """The budget per rank: the plan's."""
        return self.plan.memory_cap_bytes

    def schedule(
        self,
        epoch: int = 0,
        *,
        sample_ids: Sequence[int] | None = None,
        policy: str | None = None,
        measure: bool = True,
        on_step: Callable[[int, int], None] | None = None,
    ) -> Schedule:
        """The epoch's schedule from :attr:`plan` (``policy`` overrides the default;
        ``sample_ids`` restricts it to those samples; ``measure`` fills its measures;
        ``on_step(done, total)`` hears of the steps scheduled, for a progress line)."""
        stream = self.stream(
            epoch, sample_ids=sample_ids, policy=policy, measure=measure, on_step=on_step
        )
        return stream.schedule()

    def stream(
        self,
        epoch: int = 0,
        *,
        sample_ids: Sequence[int] | None = None,
        policy: str | None = None,
        measure: bool = True,
        on_step: Callable[[int, int], None] | None = None,
    ) -> EpochStream:
        """The epoch's schedule as an :class:`~datacentric.scheduling.epoch.EpochStream`:
        its steps in order, each built when asked for (the steps of :meth:`schedule`'s
        schedule for the same arguments), then the whole schedule."""
        return EpochStream(
            self.shapes,
            policy=policy or self.policy,
            world_size=self.world_size,
            cost_model=self.cost_model,
            plan=self.plan,
            seed=self.seed,
            epoch=epoch,
            options=self.options,
            sample_ids=sample_ids,
            measure=measure,
            on_step=on_step,
        )

    def ideal_epoch_time(
        self,
        sample_ids: Sequence[int] | None = None,
        *,
        old_bound: bool = False,
        searched: Callable[[float, float], None] | None = None,
    ) -> float:
        """The scheduler's ideal epoch time over the plan's options
        (:func:`~datacentric.scheduling.measures.ideal_epoch_time`; ``old_bound``: the
        former, priced bound, whose count ``searched(done, total)`` hears)."""
        return ideal_epoch_time(
            self.shapes,
            self.cost_model,
            self.world_size,
            plan=self.plan,
            sample_ids=sample_ids,
            old_bound=old_bound,
            searched=searched,
        )
