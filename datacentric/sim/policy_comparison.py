"""Run several scheduling policies on one workload and compare their simulated results.

The schedules come from one :class:`~datacentric.scheduling.pipeline.Pipeline` (the
very objects the runtime executes, every policy on the same plan and budget), the
epoch-time bound from the scheduler's own ideal bound, and every policy is executed by
:func:`datacentric.sim.engine.simulate` on the same cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from datacentric.planning.analytic import AnalyticCostModel
from datacentric.planning.cost_model import CostModel
from datacentric.planning.memory_cap import (
    device_memory_of,
    resolve_memory_cap,
    warn_cost_model_cap,
)
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.plan import Plan
from datacentric.planning.sharding import ShardingSpec
from datacentric.profiling.factory import analytic_cost_model
from datacentric.progress import Progress, StepShare, counted
from datacentric.schedule import Schedule
from datacentric.scheduling.pipeline import Pipeline
from datacentric.shapes import SampleShape
from datacentric.sim.engine import SimResult, simulate
from datacentric.sim.stages_at_once import Watch, failure_text, fork_context, run_at_once

if TYPE_CHECKING:
    from datacentric.settings import SchedulingConfig

#: The policies of the paper reproduction, baseline first.
DEFAULT_POLICIES = (
    "static",
    "static-reference",
    "megatron-dyncp",
    "dcp-intra",
    "dcp-inter",
    "dcp-pac",
    "dcp-opt",
)


#: Each stage's typical share (percent) of a comparison's time: the median over
#: simulate's default policies on opensora-short, -long and -balanced (16-32 ranks),
#: sft-longtail (64), stdlib-code (8) and longctx-1m (64), timed on 2 shared cores
#: (planning: a tenth of static's, its median ratio). The progress counts a stage as its
#: share, so a time left weighs a policy's search by what it usually costs (the shares
#: vary several-fold between workloads: a time left is an estimate until the long stages
#: are measured); a policy not listed counts as 1.
STAGE_SHARE = {
    "planning": 3.2,
    "static": 32.0,
    "static-reference": 0.5,
    "megatron-dyncp": 18.0,
    "dcp-intra": 1.1,
    "dcp-inter": 1.1,
    "dcp-pac": 2.4,
    "dcp-opt": 30.0,
}

#: A policy whose cost grows with the epoch's steps (it solves each step on its own):
#: its search's share and its share per step, in :data:`STAGE_SHARE`'s scale, used
#: once a first policy has told the steps. Fitted on the opensora presets (the first
#: step's search 5-7 s, then 0.5-1.2 s a step, against static's 6-15 s); elsewhere its
#: cost against static's differs up to 30-fold (sft-longtail, stdlib-code, longctx-1m).
STEP_SHARE = {"dcp-opt": (14.0, 2.5)}

#: The stage that plans, before any policy (:data:`STAGE_SHARE`'s key).
PLANNING = "planning"

#: The stage, beside the policies built at once, that prices the former bound over
#: every sample (``efficiency_old_bound``; 1.1 s of CPU on ``longctx-1m`` at 64 GPUs,
#: which the stages waited for when it was priced before them).
OLD_BOUND = "old bound"

#: The field the former bound gives (:func:`policy_table`'s), which names its failure.
OLD_BOUND_FIELD = "efficiency_old_bound"


def stage_units(policies: Sequence[str], steps: int | None = None) -> dict[str, int]:
    """The progress units of planning and of each policy (:data:`STAGE_SHARE`, at least
    1 each); with the epoch's ``steps``, by :data:`STEP_SHARE` for the policies there."""
    shares = {PLANNING: STAGE_SHARE[PLANNING]}
    shares |= {p: STAGE_SHARE.get(p, 1.0) for p in policies}
    if steps is not None:
        for policy in set(policies) & set(STEP_SHARE):
            search, per_step = STEP_SHARE[policy]
            shares[policy] = search + per_step * steps
    return {stage: max(1, round(share)) for stage, share in shares.items()}


def simulation_cost_model(
    model: str | ModelSpec,
    hardware: str,
    world_size: int,
    *,
    memory_gb: float | None = None,
    shard: ShardingSpec | str | None = None,
) -> AnalyticCostModel:
    """The analytic cost model the simulator uses for ``model`` (a name, or a spec: one
    with its keyword arguments and LoRA) on ``hardware``.

    Settings (stated, not fitted): bf16; model state held as ``shard`` says on
    ``world_size`` ranks
    (default :data:`~datacentric.planning.sharding.DEFAULT_SHARD`, the trainer's, so
    ``simulate`` plans what ``train`` runs). The model reports the whole gradient
    reduction; :func:`run_policies` overlaps it with the slowest group's last backward
    when the setting does (``ddp``, ``fsdp2``: ``simulate(..., overlap_grad_sync=True)``).
    ``memory_gb``: deprecated; the budget is :func:`simulation_budget`'s, the plan's.
    """
    if memory_gb is not None:
        warn_cost_model_cap("simulation_cost_model(memory_gb=)")
    return analytic_cost_model(
        model,
        hardware,
        dtype_bytes=2,
        shard=shard,
        world_size=world_size,
    )


def simulation_budget(cost_model: CostModel, memory_gb: float | None = None) -> int:
    """The budget per rank of a simulated run: ``memory_gb`` GiB, else the default share
    of the memory of the hardware the cost model prices."""
    return resolve_memory_cap(memory_gb, device_memory_of(cost_model))


@dataclass(frozen=True)
class PolicyRun:
    """One policy's schedule and its simulation."""

    policy: str
    schedule: Schedule
    result: SimResult
    schedule_seconds: float
    """CPU seconds the scheduler took to build the epoch (the building process's: the
    same whether the policies are built one after another or at once)."""
    ideal_epoch_time_old_s: float | None = None
    """The former, priced bound over the same samples (``efficiency_old_bound``)."""


def run_policies(
    shapes: Sequence[SampleShape],
    cost_model: CostModel,
    world_size: int,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    seed: int = 0,
    epoch: int = 0,
    record_spans: bool = False,
    options: SchedulingConfig | None = None,
    plan: Plan | None = None,
    memory_cap_bytes: int | None = None,
    errors: dict[str, str] | None = None,
    pipeline: Pipeline | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> dict[str, PolicyRun]:
    """Schedule ``shapes`` with each policy and simulate the schedules.

    Every policy gets the same ``options``, the same plan and the same budget, so
    policies are compared on equal terms: one ``pipeline``'s, or one made of the
    arguments (the planner's plan under ``memory_cap_bytes``, by default
    :func:`simulation_budget`; or ``plan``). Efficiency is against the scheduler's ideal
    bound over the samples each schedule actually runs. With ``errors`` (a dict), a
    policy whose scheduling or simulation raises is left out of the result and its
    error recorded there (benchmarks report it); without, the error propagates.
    ``progress`` counts the plan and each policy by its usual cost (:func:`stage_units`;
    its total is set here), a policy that builds its steps in order by its steps too.
    ``workers`` (above 1, where processes fork): the policies are built at once, at most
    that many, each in its own process (:mod:`~datacentric.sim.stages_at_once`; the same
    results, in the same order), beside one more that prices the former bound
    (:data:`OLD_BOUND`), and ``progress`` counts the plan, each policy and that bound as
    one part each, its time left the running stages' own; by default, one after another.
    """
    if pipeline is None:
        if plan is None and memory_cap_bytes is None:
            memory_cap_bytes = simulation_budget(cost_model)
        pipeline = Pipeline(
            shapes,
            cost_model,
            world_size=world_size,
            memory_cap_bytes=memory_cap_bytes,
            options=options,
            seed=seed,
            plan=plan,
        )
    stages = progress or Progress("", 1, enabled=False)
    at_once = (workers or 1) > 1 and len(set(policies)) > 1 and OLD_BOUND not in policies
    if at_once and fork_context() is not None:
        return _run_at_once(pipeline, policies, stages, errors, workers or 1, epoch, record_spans)
    units = stage_units(policies)
    stages.set_total(sum(units.values()))
    stages.begin(f"planning {counted(len(pipeline.shapes), 'sample', ',')}", units[PLANNING])
    _ = pipeline.plan  # planned once, before any policy: a bucket that fits nothing raises
    stages.update(units[PLANNING])
    bounds: dict[tuple[int, ...], tuple[float, float]] = {}
    runs: dict[str, PolicyRun] = {}
    for number, policy in enumerate(policies):
        stages.begin(policy, units[policy])
        try:
            runs[policy] = _run_policy(
                pipeline,
                policy,
                bounds,
                epoch=epoch,
                record_spans=record_spans,
                # a solve is told in this process's CPU seconds: its layouts are timed
                # in them too (on the wall clock, a loaded machine shrank its count)
                on_step=StageSteps(stages, time.process_time),
            )
        except Exception as err:  # recorded for the caller, see the docstring
            if errors is None:
                raise
            errors[policy] = failure_text(err)
        stages.update(units[policy])
        if len(runs) == 1 and policy in runs:  # the epoch's steps are told: weigh the rest
            later = policies[number + 1 :]
            units |= stage_units(later, len(runs[policy].schedule.iterations))
            stages.set_total(stages.done + sum(units[p] for p in later))
    return runs


def _run_at_once(
    pipeline: Pipeline,
    policies: Sequence[str],
    stages: Progress,
    errors: dict[str, str] | None,
    workers: int,
    epoch: int,
    record_spans: bool,
) -> dict[str, PolicyRun]:
    """:func:`run_policies` with the policies built at once (``workers`` at most), each
    in its own process: the plan and the proved bound over every sample are made first,
    here, so every process has them; the former bound over every sample (priced sample
    by sample, up to seconds: :data:`OLD_BOUND`) is one more process, started with
    them, and each run that kept every sample gets it once all have ended (its failure
    is theirs, as one after another)."""
    policies = list(dict.fromkeys(policies))
    stages.set_total(2 + len(policies))
    stages.begin(f"planning {counted(len(pipeline.shapes), 'sample', ',')}", 1)
    _ = pipeline.plan
    bounds = {(): (pipeline.ideal_epoch_time(), None)}
    stages.update(1, stage="")  # the bound over every sample, made once for every process
    ended: dict[str, tuple[Any, BaseException | None, str]] = {}

    def build(stage: str, on_step: Any) -> Any:  # a Relay: its steps, its count
        if stage == OLD_BOUND:
            return pipeline.ideal_epoch_time(old_bound=True, searched=on_step.searched)
        return _run_policy(
            pipeline, stage, bounds, epoch=epoch, record_spans=record_spans, on_step=on_step
        )

    def on_end(stage: str, run: Any, error: BaseException | None, text: str) -> bool:
        ended[stage] = (run, error, text)
        stages.update(1)
        return errors is not None or _first_error(policies, ended) is None

    watch = Watch(stages.clock, StageSteps)
    stages.follow(watch.outlook)
    try:  # one more process than the policies', started first: it waits for none of them
        run_at_once([OLD_BOUND, *policies], build, workers=workers + 1, watch=watch, on_end=on_end)
    finally:
        stages.follow(None)
    error = _first_error(policies, ended)
    if errors is None and error is not None:
        raise error
    old, _, old_text = ended[OLD_BOUND]
    runs = {}
    for policy in policies:
        run, _, text = ended[policy]
        if run is not None and _needs_old_bound(run):
            run, text = (
                (None, f"{OLD_BOUND_FIELD}: {old_text}")
                if old is None
                else (replace(run, ideal_epoch_time_old_s=old), text)
            )
        if run is None and errors is not None:
            errors[policy] = text
        elif run is not None:
            runs[policy] = run
    return runs


def _needs_old_bound(run: PolicyRun) -> bool:
    """Whether ``run`` kept every sample, so takes the former bound over every sample
    (:data:`OLD_BOUND`'s; a run that dropped some prices its own)."""
    return not run.schedule.dropped_sample_ids


def _first_error(policies: Sequence[str], ended: dict[str, tuple]) -> BaseException | None:
    """The error a sequential run raises, once known: in order, the first policy's that
    failed, or the former bound's (:data:`OLD_BOUND`) at the first that kept every
    sample, after all those before it were built (None: none, or not known yet)."""
    bound = ended.get(OLD_BOUND)
    for policy in policies:
        if policy not in ended:
            return None
        run, error, _ = ended[policy]
        if error is not None:
            return error
        if _needs_old_bound(run):
            if bound is None:
                return None
            if bound[1] is not None:
                return bound[1]
    return None


class StageSteps(StepShare):
    """A policy's ``on_step`` in a comparison: how far its stage is (:meth:`Progress.inside
    <datacentric.progress.Progress.inside>`), in its steps and the share told of the
    one now built (``dcp-opt``: a :class:`~datacentric.progress.StepShare`), or while it
    searches before them in the units its search counts (``searched``:
    :func:`~datacentric.scheduling.search_steps.searched`; ``static``: micro-batches
    priced, ``megatron-dyncp``: steps priced), so a long search or a long step says its
    own time left. ``clock``: the seconds its step's layouts are timed in, those dcp-opt
    tells its solves in (CPU seconds of the process that builds the step); default: the
    stages' clock (a stage's CPU seconds, where stages run at once)."""

    def __init__(self, stages: Progress, clock: Callable[[], float] | None = None) -> None:
        super().__init__(clock or stages.clock)
        self.stages = stages
        self.steps = (0, 1)
        """The stage's steps as last told: (done, total)."""
        self.stage_begun_at = 0.0
        """When the step now built began on the stages' clock (its pace's start)."""

    def __call__(self, done: int, total: int) -> None:
        self.step_out()
        self.steps = (done, total)
        self.stages.inside(done, total)

    def step_begun(self, work: float) -> None:
        super().step_begun(work)
        self.stage_begun_at = self.stages.clock()

    def laid_out(self, count: float) -> None:
        super().laid_out(count)
        self._share_moved()

    def solved(self, seconds: float) -> None:
        super().solved(seconds)
        self._share_moved()

    def _share_moved(self) -> None:
        # the first step's pace from when it began: the stage's set-up is not a step's
        begun = self.stage_begun_at if self.steps[0] == 0 else None
        self.stages.inside(*self.steps, step_share=self.step_share() or 0.0, step_begun=begun)

    def set_aside(self, seconds: float) -> None:
        """Work made once for the epoch took ``seconds`` on this step's clock inside the
        step now built: left out of the steps' pace (:meth:`Progress.set_aside
        <datacentric.progress.Progress.set_aside>`), the step's start too. On the stages'
        clock it took as much more as the step so far did (CPU seconds on a wall clock,
        one after another on a loaded machine; the same clock where stages run at once)."""
        mine, theirs = self.clock() - self.begun_at, self.stages.clock() - self.stage_begun_at
        scaled = min(seconds * theirs / mine, theirs) if mine > 0 and theirs > 0 else seconds
        self.begun_at += seconds
        self.stage_begun_at += scaled
        self.stages.set_aside(scaled)

    def searched(self, done: float, total: float) -> None:
        """The policy's search has done ``done`` of its ``total`` units (``static``:
        micro-batches priced; ``megatron-dyncp``: steps priced)."""
        self.stages.inside(int(done), max(int(total), 1), "search")


def _run_policy(
    pipeline: Pipeline,
    policy: str,
    bounds: dict[tuple[int, ...], tuple[float, float]],
    *,
    epoch: int,
    record_spans: bool,
    on_step: Callable[[int, int], None] | None = None,
) -> PolicyRun:
    """Schedule and simulate one policy; ``bounds`` caches the ideal time (the proved
    bound's and the old one's) per dropped set; ``on_step`` hears of the steps built."""
    from datacentric.scheduling.measures import overlaps_grad_sync

    start = time.process_time()  # CPU: policies built at once share the cores
    schedule = pipeline.schedule(epoch, policy=policy, measure=False, on_step=on_step)
    elapsed = time.process_time() - start
    dropped = schedule.dropped_sample_ids
    if dropped not in bounds:
        everyone = range(len(pipeline.shapes))
        kept = sorted(set(everyone) - set(dropped)) if dropped else None
        bounds[dropped] = (
            pipeline.ideal_epoch_time(sample_ids=kept),
            _old_bound(pipeline, kept),
        )
    ideal, old = bounds[dropped]
    result = simulate(
        schedule,
        pipeline.shapes,
        pipeline.cost_model,
        ideal_epoch_time_s=ideal,
        record_spans=record_spans,
        overlap_grad_sync=overlaps_grad_sync(pipeline.cost_model, pipeline.world_size),
    )
    return PolicyRun(policy, schedule, result, elapsed, old)


def _old_bound(pipeline: Pipeline, sample_ids: list[int] | None) -> float:
    """The former bound over ``sample_ids``: an error its pricing raises carries the
    note :data:`OLD_BOUND_FIELD`, so its text (:func:`failure_text`) names it as the
    bound's own stage does where the policies are built at once."""
    try:
        return pipeline.ideal_epoch_time(sample_ids=sample_ids, old_bound=True)
    except Exception as err:
        err.add_note(OLD_BOUND_FIELD)
        raise


def policy_table(runs: dict[str, PolicyRun]) -> dict[str, dict[str, Any]]:
    """Per policy: ``tokens_per_s``, ``speedup_vs_static`` and
    ``speedup_vs_static_reference`` (None without that baseline), ``idle_share``,
    ``efficiency``, ``tokens_per_step_mean`` and the other headline numbers."""
    table: dict[str, dict[str, Any]] = {}
    for policy, run in runs.items():
        row = run.result.summary()
        row.pop("policy")
        for base, key in (
            ("static", "speedup_vs_static"),
            ("static-reference", "speedup_vs_static_reference"),
        ):
            ref = runs.get(base)
            row[key] = run.result.tokens_per_s / ref.result.tokens_per_s if ref else None
        steps = [it.num_tokens for it in run.schedule.iterations] or [0]
        row["tokens_per_step_mean"] = sum(steps) / len(steps)
        row["tokens_per_step_max"] = max(steps)
        row["samples_dropped"] = len(run.schedule.dropped_sample_ids)
        row["schedule_seconds"] = run.schedule_seconds
        old = run.ideal_epoch_time_old_s
        epoch = run.result.epoch_time_s
        row[OLD_BOUND_FIELD] = old / epoch if old and epoch else None
        table[policy] = row
    return table
