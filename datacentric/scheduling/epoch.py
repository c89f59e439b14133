"""The scheduler's entry point: ``build_schedule`` and the policy registry."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from multiprocessing.connection import Connection

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling import (
    dcp_inter,
    dcp_intra,
    dcp_opt,
    dcp_pac,
    megatron_dyncp,
    packed,
    static,
    static_reference,
)
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.measures import (
    old_gpu_seconds,
    sample_gpu_seconds,
    schedule_measures,
    step_bound_s,
)
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput, PolicySteps
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import SampleShape


class CollectorPause:
    """Python's cyclic garbage collector paused while an epoch is built (a context
    manager; nested and concurrent builds share one pause, and the collector runs again
    when the last ends, if it ran before the first began).

    A build keeps hundreds of thousands of new objects (micro-batches, their samples,
    the cost model's answers), so the collector's full passes, which also walk every
    sample shape of the dataset, came three times per epoch: 0.6 of 6.1 s of CPU on
    sft-longtail 1,000,000 samples at 1,024 GPUs. Nothing a build computes depends on
    the collector; garbage with cycles made meanwhile is collected after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a child forked during a build (the process that builds the next epoch):
        no build of its own runs yet, so the collector runs as it did before the pause."""
        self._lock = threading.Lock()
        if self._depth and self._was_enabled:
            gc.enable()
        self._depth = 0

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()


#: The pause every epoch build (:class:`EpochStream`) runs under.
COLLECTOR_PAUSE = CollectorPause()

#: The policies that build their steps one at a time, in order (:class:`EpochStream`).
STEPWISE: dict[str, Callable[[PolicyInput], PolicySteps]] = {"dcp-opt": dcp_opt.stepwise}

#: Every policy by name: a pure function of its :class:`PolicyInput`.
POLICIES: dict[str, Callable[[PolicyInput], PolicyOutput]] = {
    "static": static.schedule,
    "static-reference": static_reference.schedule,
    "packed": packed.schedule,
    "dcp-intra": dcp_intra.schedule,
    "dcp-inter": dcp_inter.schedule,
    "dcp-pac": dcp_pac.schedule,
    "megatron-dyncp": megatron_dyncp.schedule,
    "dcp-opt": dcp_opt.schedule,
}


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator every rank derives for ``(seed, epoch)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch)]))


def build_schedule(
    shapes: Sequence[SampleShape],
    *,
    policy: str,
    world_size: int,
    cost_model: CostModel,
    plan: Plan,
    seed: int = 0,
    epoch: int = 0,
    options: SchedulingConfig | None = None,
    sample_ids: Sequence[int] | None = None,
    measure: bool = True,
    on_step: Callable[[int, int], None] | None = None,
) -> Schedule:
    """An epoch of iterations for the dataset ``shapes`` (sample id = index).

    A pure function of its arguments: every rank computes the same schedule, with
    no communication. ``plan`` is the one authority on what each bucket may run with
    (its options) and on the memory budget, which the schedule carries
    (``Schedule.memory_cap_bytes``); its skipped buckets' samples are dropped
    (reported). :class:`~datacentric.scheduling.pipeline.Pipeline` makes the plan and
    calls this.
    ``sample_ids`` restricts the epoch to those samples (the rest are listed as
    dropped; :func:`~datacentric.scheduling.resume.continue_schedule` uses it).
    ``measure`` fills ``meta`` with imbalance, efficiency, the ideal bound and the
    per-step bounds (``efficiency_step_bound``). ``meta["settings"]`` holds what the
    policy chose (e.g. ``static``'s SP size, recomputation and token budget).
    ``on_step(done, total)`` is told the steps scheduled so far out of the epoch's (a
    progress line); it changes nothing in the schedule.
    """
    stream = EpochStream(
        shapes,
        policy=policy,
        world_size=world_size,
        cost_model=cost_model,
        plan=plan,
        seed=seed,
        epoch=epoch,
        options=options,
        sample_ids=sample_ids,
        measure=measure,
        on_step=on_step,
    )
    return stream.schedule()


class EpochStream:
    """An epoch's schedule built step by step, in order: iterating it yields its
    iterations, each built when it is asked for (a policy of :data:`STEPWISE` builds
    each step from its own global batch and the searches it makes once for the epoch;
    any other policy builds its whole epoch at the first step); :meth:`schedule` is the
    whole :class:`Schedule`, the steps not yet asked for built first, then its meta and
    measures. :func:`build_schedule` is this stream run to its end, so a stream's steps
    are the very steps of the schedule ``build_schedule`` returns for the same
    arguments. One consumer at a time (the runtime's is one background thread).
    :attr:`num_steps` is known before any step is built: one step per global batch."""

    def __init__(
        self,
        shapes: Sequence[SampleShape],
        *,
        policy: str,
        world_size: int,
        cost_model: CostModel,
        plan: Plan,
        seed: int = 0,
        epoch: int = 0,
        options: SchedulingConfig | None = None,
        sample_ids: Sequence[int] | None = None,
        measure: bool = True,
        on_step: Callable[[int, int], None] | None = None,
    ) -> None:
        _check_call(policy, world_size, plan)
        options = options or SchedulingConfig()
        self.spec = {
            "shapes": shapes,
            "policy": policy,
            "world_size": world_size,
            "cost_model": cost_model,
            "plan": plan,
            "seed": seed,
            "epoch": epoch,
            "options": options,
            "sample_ids": sample_ids,
            "measure": measure,
        }
        """What the stream is a function of: ``EpochStream(**spec)`` elsewhere (another
        process: :func:`send_stream`) builds the same steps (progress is not sent)."""
        self._started = time.perf_counter()
        with COLLECTOR_PAUSE:  # the dataset view and the global batches
            view = DatasetView(shapes)
            self._asked, self._not_asked, self._skipped = _samples_to_schedule(
                view, plan, sample_ids
            )
            if not self._asked.any():
                raise ValueError("no samples to schedule (all were skipped or excluded)")
            self.inp = PolicyInput(
                view=view,
                cost_model=cost_model,
                world_size=int(world_size),
                options=options,
                plan=plan,
                rng=epoch_rng(seed, epoch),
                active=np.flatnonzero(self._asked),
                seed=int(seed),
                epoch=int(epoch),
                on_step=on_step,
            )
            self.num_steps = len(self.inp.global_batches()[0])
            """Steps of the epoch (its global batches)."""
        self.policy, self.measure = policy, measure
        self._built: list[Iteration] = []
        self._steps: PolicySteps | None = None
        self._memoised = False
        self._schedule: Schedule | None = None

    def __iter__(self) -> Iterator[Iteration]:
        """The iterations not yet yielded, in order, each built when asked for."""
        with COLLECTOR_PAUSE:
            steps = iter(self._policy_steps().steps)
        while True:
            with COLLECTOR_PAUSE:  # each step, built when asked for
                it = next(steps, None)
            if it is None:
                return
            self._built.append(it)
            yield it

    def _policy_steps(self) -> PolicySteps:
        if self._steps is None:
            inp, policy = self.inp, self.policy
            memo = inp.memoised(policy)
            self._memoised = memo is not None
            if memo is not None:
                self._steps = PolicySteps.of(memo)
            elif policy in STEPWISE:
                self._steps = STEPWISE[policy](inp)
            else:
                self._steps = PolicySteps.of(inp.run_policy(policy, POLICIES[policy]))
        return self._steps

    def schedule(self) -> Schedule:
        """The whole epoch's :class:`Schedule` (built once)."""
        if self._schedule is None:
            for _ in self:  # the steps not yet built
                pass
            with COLLECTOR_PAUSE:
                self._schedule = self._whole()
        return self._schedule

    def _whole(self) -> Schedule:
        """The whole epoch's :class:`Schedule` of the steps built."""
        steps, inp = self._policy_steps(), self.inp
        out = PolicyOutput(list(self._built), list(steps.dropped), dict(steps.settings))
        if not self._memoised:
            inp.memoise(self.policy, out)
        inp.step_done(len(out.iterations), len(out.iterations))
        dropped = np.concatenate([self._skipped, np.asarray(out.dropped, dtype=np.int64)])
        schedule = _schedule_of(inp, self.policy, out, self._not_asked, self._skipped, dropped)
        schedule.meta["plan_seconds"] = time.perf_counter() - self._started
        if self.measure:
            kept = self._asked.copy()
            kept[dropped] = False
            schedule.meta.update(_measures(schedule, inp, np.flatnonzero(kept)))
        return schedule


def send_stream(spec: dict, conn: Connection) -> None:
    """Build ``EpochStream(**spec)`` and send its steps through ``conn`` as they are
    built (``("step", iteration)``), then ``("schedule", schedule)``, or
    ``("error", error)`` where the build raises: the body of a process that builds an
    epoch's schedule away from the training loop (its interpreter lock). Once the loop
    reads no more (its process ended, as a loop that stops within the epoch does), the
    build stops without a word."""
    try:
        stream = EpochStream(**spec)
        for iteration in stream:
            conn.send(("step", iteration))
        conn.send(("schedule", stream.schedule()))
    except (BrokenPipeError, ConnectionResetError):  # nobody reads: nothing to say
        pass
    except Exception as err:  # raised again where the runtime takes a step
        try:
            conn.send(("error", err))
        except Exception:  # an error that does not pickle: its words
            conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))
    finally:
        conn.close()


def serve_stream(inputs: Connection, out: Connection) -> None:
    """The body of a build process started afresh (not forked): read the spec from
    ``inputs``, say ``("started", None)`` through ``out``, then :func:`send_stream`; or
    say ``("unreadable", words)`` when the spec cannot be loaded here (a class of the
    parent's main script, say), so the parent builds the epoch itself."""
    try:
        spec = inputs.recv()
    except Exception as err:  # the parent builds it on a thread instead
        out.send(("unreadable", f"{type(err).__name__}: {err}"))
        out.close()
        return
    finally:
        inputs.close()
    out.send(("started", None))
    send_stream(spec, out)


def _check_call(policy: str, world_size: int, plan: Plan) -> None:
    """Raise on a policy name, world size or plan :func:`build_schedule` cannot use."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not isinstance(plan, Plan):
        raise TypeError("build_schedule needs the plan (Pipeline(...).plan, or plan_buckets)")


def _schedule_of(
    inp: PolicyInput,
    policy: str,
    out: PolicyOutput,
    not_asked: np.ndarray,
    skipped: np.ndarray,
    dropped: np.ndarray,
) -> Schedule:
    """The :class:`Schedule` of the policy's ``out``, its ``meta`` telling the samples
    excluded (``not_asked``), skipped by the plan and dropped (``dropped``, the skipped
    ones included), the budget, the options and the policy's settings."""
    view, options = inp.view, inp.options
    meta: dict = {
        "samples_total": view.num_samples,
        "samples_excluded": int(len(not_asked)),
        "samples_dropped": int(len(dropped)),
        "samples_skipped_by_plan": int(len(skipped)),
        "memory_cap_bytes": inp.memory_cap_bytes,
        # the options the policy ran with (which policy ran is the schedule's ``policy``)
        "options": {k: v for k, v in asdict(options).items() if k != "policy"},
        "settings": dict(out.settings),
    }
    return Schedule(
        world_size=inp.world_size,
        policy=policy,
        seed=inp.seed,
        epoch=inp.epoch,
        num_samples=view.num_samples,
        iterations=tuple(out.iterations),
        dropped_sample_ids=tuple(sorted(int(i) for i in np.concatenate([not_asked, dropped]))),
        meta=meta,
        memory_cap_bytes=inp.memory_cap_bytes,
    )


def _samples_to_schedule(
    view: DatasetView, plan: Plan, sample_ids: Sequence[int] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(asked, not_asked, skipped)``: the mask of the samples this epoch schedules, the
    ids left out by ``sample_ids`` and the ids of the buckets the plan skipped."""
    asked = np.ones(view.num_samples, dtype=bool)
    if sample_ids is not None:
        ids = np.asarray(sample_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= view.num_samples):
            raise ValueError(f"sample_ids must lie in 0..{view.num_samples - 1}")
        asked[:] = False
        asked[ids] = True
    not_asked = np.flatnonzero(~asked)
    skipped = np.zeros(0, dtype=np.int64)
    if plan.skipped:
        gone = [view.bucket_index[name] for name in plan.skipped if name in view.bucket_index]
        in_gone = np.isin(view.bucket_of, gone)
        skipped = np.flatnonzero(asked & in_gone)
        asked &= ~in_gone
    return asked, not_asked, skipped


def _measures(schedule: Schedule, inp: PolicyInput, scheduled: np.ndarray) -> dict:
    """Imbalance, efficiency, the ideal bound and the per-step bounds of ``schedule``
    (``scheduled``: the ids it runs), each sample priced at its own length."""
    view, world_size = inp.view, inp.world_size
    table = inp.pac_table()
    work = np.zeros(view.num_samples)
    work[scheduled] = sample_gpu_seconds(table, scheduled)
    ideal = float(work.sum()) / world_size if len(scheduled) else None
    bounds = []
    for it in schedule.iterations:
        ids = np.asarray(it.sample_ids(), dtype=np.int64)
        bounds.append(step_bound_s(table, ids, world_size, work[ids]))
    out = schedule_measures(
        schedule, inp.cost_model, ideal, shapes=view.shapes, step_bounds_s=bounds
    )
    old = float(old_gpu_seconds(table, scheduled).sum()) / world_size if ideal else None
    epoch = out["est_epoch_time_s"]
    out["ideal_epoch_time_old_s"] = old
    out["efficiency_old_bound"] = old / epoch if old and epoch else None
    return out
