"""The public API: a few changed lines turn a plain PyTorch loop into a DCP loop.

.. code-block:: python

    dc = DataCentric(model, dataset, preset="llama", policy="dcp-opt")
    model = dc.model                              # held as ``shard`` says (FSDP2 default)
    optimizer = torch.optim.AdamW(model.parameters())
    for step in dc.steps():
        for micro in step:                        # this rank's micro-batches
            micro.backward(model(micro.batch))    # per-token loss, weighted exactly
        loss = step.finish()                      # one gradient reduction per step
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

``DataCentric`` owns the process groups (from torchrun's environment, or one
process on ``cuda`` when available, ``device`` overriding), holds the model as the
``shard`` setting says (``dc.model``: create the optimizer from its parameters,
after ``DataCentric``), injects sequence-parallel attention and per-block recomputation into
the model, plans every bucket of the dataset's shapes and schedules each epoch
with the chosen policy. Every rank computes the same schedule, with no
communication. The gradient after ``step.finish()`` is the global batch's mean
gradient, whatever the groups, accumulation counts and recomputation.

The trainer behind ``datacentric train`` drives this same object (built for a run by
:func:`~datacentric.train.assemble.assemble_run`, in its documented order): its loop is the
one above plus clipping, logging and checkpoints. ``dc.state_dict()`` is where the
run stands (a :class:`~datacentric.scheduling.resume.Position`); after
``dc.load_state_dict(state)``, ``dc.steps()`` continues there, on any world size.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from datacentric.data.base import epoch_pack
from datacentric.data.prefetch import Prefetcher, rank_requests
from datacentric.models.lora import is_peft_model
from datacentric.models.source import check_data_kind
from datacentric.parallel.grad_sync import wrap_model
from datacentric.parallel.groups import ProcessGroups, planning_memory_bytes, process_groups
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.recompute import compile_blocks
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import Step
from datacentric.planning.cost_model import CostModel
from datacentric.planning.heads import ulysses_sp_sizes as ulysses_sp_sizes  # its old home
from datacentric.planning.memory_cap import resolve_memory_cap
from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec
from datacentric.planning.spec_derivation import spec_of_model
from datacentric.profiling.factory import named_spec
from datacentric.progress import counted
from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import (
    GroupCap,
    covering_tokens,
    default_tokens_per_iteration,
    samples_per_step,
    short_step,
)
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import (
    Position,
    batch_tokens_to_record,
    begin_segment,
    check_fingerprint,
    check_known_steps,
    check_length,
    check_segment,
    check_steps_run,
    resumed_global_batch,
    steps_fingerprint,
)
from datacentric.settings.scheduling import SchedulingConfig
from datacentric.shapes import SampleShape
from datacentric.train.build import device_cost_model
from datacentric.train.rank_agreement import check_same_plan
from datacentric.train.reporting.metric_sinks import logger
from datacentric.train.schedule_ahead import ScheduleAhead, StreamedBuild
from datacentric.train.validation.held_out import HeldOut, validation_loss
from datacentric.verify.model_contract import check_model_contract

#: ``on_schedule(schedule, at_step)`` of :meth:`DataCentric.steps`.
OnSchedule = Callable[[Schedule, "int | None"], None]


def announce_default_shard(sharding: ShardingSpec, groups: ProcessGroups) -> None:
    """Warn when the default ``shard`` (FSDP2 since 0.2.0) holds the model otherwise than
    0.1.0 did (a plain module): on more than one rank, gradients and state are DTensors."""
    world = groups.world_size if groups.distributed else 1
    if sharding.effective(world).mode != "fsdp2" or getattr(groups, "rank", 0) != 0:
        return  # said once, by rank 0, not by every rank
    warnings.warn(
        "DataCentric holds the model with FSDP2 by default since 0.2.0 (0.1.0 held it whole): "
        "after step.finish() each p.grad is a DTensor, sharded and already reduced, and "
        "model.state_dict() holds DTensors; use p.grad.full_tensor() for the whole gradient "
        "and do not all_reduce it, or pass shard='none' for plain tensors (pass shard= to "
        "silence this; docs/api.md)",
        UserWarning,
        stacklevel=3,
    )


def scheduling_options(
    options: SchedulingConfig | None, policy: str | None, tokens_per_iteration: int | None
) -> SchedulingConfig:
    """The ``[scheduling]`` section of a :class:`DataCentric`: ``options``, or one made of
    ``policy`` and ``tokens_per_iteration``; one of those given beside an ``options``
    that says otherwise is a ``ValueError`` naming both (which one would win is a guess)."""
    given = {"policy": policy, "tokens_per_iteration": tokens_per_iteration}
    given = {key: value for key, value in given.items() if value is not None}
    if options is None:
        return SchedulingConfig(**given)
    for key, value in given.items():
        if getattr(options, key) != value:
            raise ValueError(
                f"DataCentric: {key}={value!r} and options.{key}={getattr(options, key)!r} "
                f"differ; give {key} once (in options, or leave options out)"
            )
    return options


def held_model(model: nn.Module, dataset: Any) -> nn.Module:
    """``model`` as :class:`DataCentric` holds it: a ``peft.PeftModel`` of a transformers
    causal LM wrapped in ``HFCausalLM``. A model given data of the other kind (a text
    model given video, a video model given text) is refused here, in the line the CLI's
    check says (:func:`~datacentric.models.source.check_data_kind`), before a step."""
    if is_peft_model(model):  # a transformers model the user adapted with peft
        from datacentric.models.hf import HFCausalLM

        model = HFCausalLM(model)
    check_data_kind(model, dataset)
    return model


def check_default_batch(
    options: SchedulingConfig,
    shapes: Sequence[SampleShape],
    *,
    world_size: int,
    sp_sizes: Sequence[int],
    seed: int = 0,
) -> None:
    """Raise one-line ``ValueError`` (``DataCentric: ...``) when the Python API's default
    global batch (``options`` give none:
    :func:`~datacentric.scheduling.global_batches.default_tokens_per_iteration`) cannot fill
    the groups covering ``world_size`` ranks with the SP sizes ``sp_sizes`` allows: fewer
    samples than groups, or a first epoch cut into a step of too few (few long samples).
    Why here: this default is chosen when ``DataCentric`` is built, and its failure
    was found at the first ``steps()`` with advice (a larger global batch, dropping the
    remainder) that could not help; the message names the model's SP sizes, the samples
    and a fix that works. Pure."""
    if options.global_batch_tokens is not None or options.global_batch_samples is not None:
        return
    if not len(shapes):
        return
    tokens = [shape.tokens for shape in shapes]
    cap = GroupCap.of(options, world_size, max(sp_sizes, default=1))
    needed = samples_per_step(world_size, cap.size)
    where = (
        f"a step on {counted(world_size, 'rank')} needs one sample in each of its {needed} "
        f"groups (groups of at most {counted(cap.size, 'rank')}: {cap.source}, of the SP "
        f"sizes {list(sp_sizes)} the model's heads allow on {world_size})"
    )
    if len(tokens) < needed:
        raise ValueError(
            f"DataCentric: the dataset has {counted(len(tokens), 'sample')} and {where}: give "
            f"{needed} samples or more, or run on at most {len(tokens) * cap.size} ranks"
        )
    view, fix = DatasetView(shapes), covering_tokens(tokens, needed, options.drop_remainder)
    default = default_tokens_per_iteration(view, np.arange(len(tokens)), world_size)
    if default >= fix:
        return  # every data order fills the groups
    batches, short = short_step(view, options, seed, 0, (None, None), world_size, needed)
    if short is not None:
        raise ValueError(
            f"DataCentric: the default global batch ({default:,} tokens) cuts step "
            f"{short + 1} of epoch 0 to {counted(len(batches[short]), 'sample')} and {where}: pass "
            f"tokens_per_iteration={fix} or more (every step then holds {needed}), or run on "
            "fewer ranks"
        )


def planning_sp_sizes(
    model: nn.Module,
    shapes: Sequence[SampleShape],
    world_size: int,
    options: SchedulingConfig,
    seed: int,
    sp_sizes: Sequence[int] | None,
) -> list[int]:
    """The SP sizes a :class:`DataCentric` plans with (``sp_sizes``, else
    :func:`~datacentric.planning.heads.ulysses_sp_sizes` of ``model`` on ``world_size``
    ranks), once the default global batch is checked to fill the groups they allow
    (:func:`check_default_batch`): where the default
    is chosen, not at the first :meth:`DataCentric.steps`."""
    sizes = list(sp_sizes) if sp_sizes is not None else ulysses_sp_sizes(model, world_size)
    check_default_batch(options, shapes, world_size=world_size, sp_sizes=sizes, seed=seed)
    return sizes


class DataCentric:
    """Data-centric parallel training of ``model`` on ``dataset``.

    ``model`` follows the model contract (``blocks``, ``set_attention``,
    ``num_heads``, ``loss_mode``, ``forward(batch) -> per-token loss``), or is a
    ``peft.PeftModel`` of a transformers causal LM (wrapped in ``HFCausalLM``; only its
    adapters train, and the cost model prices only them);
    ``dataset`` has ``shapes()``, ``pack(ids, pad_to_multiple, *, epoch)`` and
    ideally ``loss_tokens(id)`` (docs/data.md). The cost model is ``cost_model`` if given, else the
    analytic model of ``preset`` on this device; it only prices memory.
    ``memory_gb`` is each rank's memory budget (default: 70% of the device's memory; on
    the CPU, of this machine's memory shared by the world's ranks on it), held by the
    plan and every schedule. ``policy`` (default ``dcp-opt``) and ``tokens_per_iteration``
    (the global batch's bound) are the ``[scheduling]`` section's, which ``options`` (a
    :class:`SchedulingConfig`) gives whole: each setting is given once
    (:func:`scheduling_options`). ``prefetch`` micro-batches are packed ahead in a
    background thread while :meth:`steps` runs (0: pack each one when it is needed).
    ``shard`` (a
    :class:`~datacentric.planning.sharding.ShardingSpec` or ``none``/``ddp``/``fsdp2``;
    default :data:`~datacentric.planning.sharding.DEFAULT_SHARD`) says how the model is
    held across ranks: call :attr:`model` and build the optimizer from its parameters.
    ``device`` picks a single process's device (default: ``cuda`` when available).
    ``compile=True`` compiles each block's forward with ``torch.compile``
    (:func:`~datacentric.parallel.recompute.compile_blocks`) before the model is wrapped.
    ``dtype`` (``float32`` or ``bfloat16``): the dtype the loop trains in, which the
    analytic cost model (``cost_model`` not given) prices activations in; ``bfloat16``
    is float32 weights, gradients and optimizer state with each forward run under
    ``torch.autocast(device_type, torch.bfloat16)``, which the loop does itself, as
    ``datacentric train --dtype bfloat16`` does.
    ``sp_sizes``: the SP sizes the planner may use (default:
    :func:`~datacentric.planning.heads.ulysses_sp_sizes` of ``model`` on this world; a
    caller that computed them for its cost model passes them).
    """

    _ran_here = False  # steps() has handed out a step of this object (_check_limits)

    def __init__(
        self,
        model: nn.Module,
        dataset,
        *,
        policy: str | None = None,
        preset: str | None = None,
        cost_model: CostModel | None = None,
        memory_gb: float | None = None,
        tokens_per_iteration: int | None = None,
        seed: int = 0,
        dtype: str = "float32",
        groups: ProcessGroups | None = None,
        prefetch: int = 2,
        check_model: bool = True,
        shard: ShardingSpec | str | None = None,
        device: str | torch.device | None = None,
        options: SchedulingConfig | None = None,
        compile: bool = False,
        sp_sizes: Sequence[int] | None = None,
    ) -> None:
        options = scheduling_options(options, policy, tokens_per_iteration)  # settings first
        model = held_model(model, dataset)
        self.groups = groups or process_groups(device=device)
        self.sharding = (
            shard if isinstance(shard, ShardingSpec) else ShardingSpec(shard or DEFAULT_SHARD)
        )
        """How the model is held (``none``, ``ddp``, ``fsdp2``; the plan assumes the same)."""
        shapes = dataset.shapes()  # the default global batch is checked here, not at steps()
        sp_sizes = planning_sp_sizes(model, shapes, self.groups.world_size, options, seed, sp_sizes)
        if shard is None:
            announce_default_shard(self.sharding, self.groups)
        if cost_model is None:  # the analytic model of the preset's spec, else the model's
            spec = named_spec(preset) if preset is not None else spec_of_model(model)
            cost_model = device_cost_model(
                spec,
                self.groups.device,
                dtype,
                shard=self.sharding,
                world_size=self.groups.world_size,
                ranks_per_node=self.groups.ranks_per_node,
            )
        self.module = model.to(self.groups.device)
        """The user's module (inside ``model``'s DDP wrapper, when there is one)."""
        if check_model:  # before any wrapper: three local forward passes
            check_model_contract(self.module, dataset)
        if compile:  # per block, before wrapping or sharding and before recomputation
            compile_blocks(self.module)
        self.model = wrap_model(self.module, self.groups, self.sharding)
        """The module to call: wrapped (DDP) or sharded (FSDP2) as ``shard`` says."""
        self.dataset = dataset
        loss_tokens = loss_tokens_function(dataset)  # each sample's tokens that carry loss
        memory = planning_memory_bytes(self.groups)  # collective: every rank, memory_gb or not
        self.pipeline = Pipeline(
            shapes,
            cost_model,
            world_size=self.groups.world_size,
            memory_cap_bytes=resolve_memory_cap(memory_gb, memory),
            options=options,
            seed=seed,
            sp_sizes=sp_sizes,
        )
        """Plans the dataset once (``pipeline.plan``, holding the memory budget: ``memory_gb``,
        else 70% of the smallest rank's device) and builds each epoch's schedule."""
        self.runtime = DataCentricRuntime(self.model, self.groups, dataset.pack, loss_tokens)
        self.prefetcher = Prefetcher(epoch_pack(dataset, 0), depth=prefetch) if prefetch else None
        check_same_plan(self.groups, self.pipeline)  # planned now; ranks that differ refused
        self.position = Position()
        """Where the run stands; :meth:`steps` advances it, :meth:`state_dict` saves it."""
        # the segment's whole schedule, else its steps streaming (_build); where it began
        self._build: StreamedBuild | None = None
        self._leave_segment()  # none yet (_segment, _announced, a resumed one's checks)
        self._segment_epoch, self._segment_at, self._serial = -1, None, 0
        self._on_schedule: OnSchedule | None = None
        self._held_out: HeldOut | None = None
        self._ahead, self._schedule_wait_s = ScheduleAhead(self.schedule), 0.0
        self.ran_unchecked: tuple[int, int] | None = None
        """Steps (first, last) run on a resumed segment's rebuilt schedule before it was
        refused (it differs from the saved one); ``None``: no such refusal."""
        self.resume_unchecked = False  # a resumed record not yet checked (load_state_dict)

    @property
    def rank(self) -> int:
        return self.groups.rank

    def schedule(self, epoch: int = 0, sample_ids: Sequence[int] | None = None) -> Schedule:
        """The epoch's schedule (the same on every rank); ``sample_ids`` restricts it."""
        return self.pipeline.schedule(epoch, sample_ids=sample_ids)

    @property
    def planner(self) -> Pipeline:
        """Deprecated name of :attr:`pipeline`."""
        warnings.warn(
            "DataCentric.planner is deprecated: use DataCentric.pipeline",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.pipeline

    def evaluate(
        self,
        dataset,
        *,
        autocast: AbstractContextManager | None = None,
        progress: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """The held-out loss of ``dataset`` (any dataset, as ``DataCentric`` takes) under
        the model as it is now: forward only, on every rank (collective: call it on all),
        each sample weighted as in training over the whole set, the same value on any
        world size; gradients, optimizer and random streams untouched. Its schedule is
        made on the first call with this dataset (the run's cost model, budget and policy;
        docs/configuration.md, "Validation during training"). ``autocast``: the context
        the forward passes run in (mixed precision). ``stop()``: this rank's stop signal,
        agreed by the ranks before each batch (one small all-reduce); once it is true on
        any rank, no rank starts another batch and the loss is ``None`` on every rank."""
        held_out = self.prepare_evaluation(dataset)
        return validation_loss(self, held_out, autocast=autocast, progress=progress, stop=stop)

    def prepare_evaluation(self, dataset) -> HeldOut:
        """Plan and schedule ``dataset`` for :meth:`evaluate` now (made once per dataset;
        raises ``ValueError`` when a sample fits no configuration under the budget)."""
        if self._held_out is None or self._held_out.dataset is not dataset:
            self._held_out = HeldOut(dataset, self.pipeline)
        _ = self._held_out.schedule
        return self._held_out

    def set_epoch(self, epoch: int) -> None:
        """Pack the coming steps' micro-batches for ``epoch`` (per-epoch noise, crops)."""
        self.runtime.pack = epoch_pack(self.dataset, epoch)

    def close(self) -> None:
        """Stop the background packing (a no-op without it)."""
        if self.prefetcher is not None:
            self.prefetcher.close()

    def _expect(self, fresh: bool) -> None:
        """Pack this rank's micro-batches of the segment ahead, from the position on:
        on a ``fresh`` segment (this epoch's draws), and again while its steps stream
        each time the steps built have doubled, and once they are all built."""
        p = self.position
        if fresh:
            self.set_epoch(p.epoch)  # the dataset packs this epoch's draws
        if self.prefetcher is None:
            return
        if self._segment is not None:
            steps, whole = self._segment.iterations[p.segment_iteration :], True
        else:
            steps, whole = self._build.built_steps(p.segment_iteration), False
        built = p.segment_iteration + len(steps)
        if not (fresh or (whole and self._expected < built) or built >= 2 * self._expected):
            return
        pack = self.runtime.pack if fresh else None
        self.prefetcher.expect(rank_requests(steps, self.rank), pack)
        self.runtime.pack = self.prefetcher
        self._expected = built

    def step(self, iteration: Iteration) -> Step:
        """A :class:`Step` for one iteration of any schedule (the position stays)."""
        return Step(self.runtime, iteration)

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands (JSON-able): save it with the model and optimizer. While
        the steps of a segment begun here stream, it waits for the whole schedule first
        (the position holds its fingerprint, checked when a resume rebuilds it). A
        resumed segment's position is saved at once with the record it was resumed from
        (the whole fingerprint, else that of its first steps, extended by the steps built
        since): the run checks it once its schedule is whole, and stops there on a
        difference. It holds the global batch the run trains (:meth:`load_state_dict`)."""
        self._settle(wait=not (self._saved is not None and self._in_segment()))
        if self._build is not None and self._in_segment():
            self._hold_built_steps()
        pipeline, p = self.pipeline, self.position
        p.global_batch_tokens = batch_tokens_to_record(
            pipeline.options, pipeline.shapes, self.groups.world_size
        )
        return p.to_json()

    def stop_building(self) -> None:
        """Cancel the segment's schedule still being built, for a run that stops now (on
        a signal, its grace period short): :meth:`state_dict` then saves the position
        without waiting for it, holding the fingerprint it already holds (a resumed
        segment's saved one, not re-verified: the next resume checks it; a segment
        begun here: the fingerprint of its steps built so far, which a resume checks
        once it has built them, besides the samples of the steps that ran) and the
        segment is never announced (``on_schedule``). A no-op once the schedule is whole;
        a later step builds the segment again."""
        if self._build is not None:
            if self._in_segment():
                self._hold_built_steps()
            self._leave_segment()

    def _in_segment(self) -> bool:
        """Whether the position stands in the segment held or streaming."""
        p = self.position
        return p.epoch == self._segment_epoch and p.segment_world == self.groups.world_size

    def _hold_built_steps(self) -> None:
        """Hold in the position the fingerprint of the streaming segment's steps built so
        far, where its whole one is not known (a segment begun here, or resumed from a
        position saved so): once the steps of such a resumed position are checked."""
        p = self.position
        if p.segment_fingerprint or not self._steps_checked:
            return  # the saved fingerprint or steps stand, to be checked later
        built = self._build.built_steps(0)
        if len(built) > p.segment_steps_known:
            p.known_steps(len(built), steps_fingerprint(built))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved :meth:`state_dict`, on this world size: on another
        one the samples the epoch has not run are re-planned for this world.
        :attr:`resume_unchecked` holds from here until the rebuilt schedule is checked
        against the record of it the state holds (its fingerprint, or that of its first
        steps): until then the run may still be refused, its steps since the resume run
        on a schedule that differs (a checkpoint from before them is the one to keep).
        Given no global batch, the one the state recorded is kept (refused where a step of
        it cannot fill this world's groups); another is refused
        (:func:`~datacentric.scheduling.resume.resumed_global_batch`)."""
        p, pipeline, world = Position.from_json(state), self.pipeline, self.groups.world_size
        options, here = pipeline.options, {"sp_sizes": pipeline.sp_sizes, "seed": pipeline.seed}
        kept = resumed_global_batch(options, p, pipeline.shapes, world, **here)
        if kept is not None:
            self.pipeline.options = kept.applied(options)
            if kept.note and self.rank == 0:
                logger.info("note: %s", kept.note)
        self.position = p
        self.resume_unchecked = bool(p.segment_fingerprint or p.segment_steps_known)
        self._leave_segment()

    def current_schedule(self) -> Schedule:
        """The schedule the next step comes from (built once per segment; while its
        steps stream, this waits until they are all built)."""
        self._open_segment()
        self._settle(count=False)  # the caller's wait, not a step's
        assert self._segment is not None
        return self._segment

    def current_length(self) -> int:
        """Steps of the schedule the next step comes from, known before its steps are
        built (one per global batch)."""
        self._open_segment()
        if self._segment is not None:
            return len(self._segment.iterations)
        return self._build.num_steps

    def _open_segment(self) -> None:
        """Start the segment the position is in, unless it is the current one: the
        epoch's schedule built ahead is taken when there is one; any other is streamed
        (:class:`~datacentric.train.schedule_ahead.StreamedBuild`), a saved one resumed on
        its world too: its steps up to the position are compared with those the position
        ran before the next step is handed out, and its fingerprint once it is whole
        (:meth:`_settle`; nothing is saved before). A resumed segment left before it was
        whole is waited for and checked first, and one whose steps are all built is
        waited for and announced (its last step can run before its whole schedule comes)."""
        p = self.position
        world = self.groups.world_size
        if p.segment_world == world and self._segment_epoch == p.epoch:
            if self._segment is not None or self._build is not None:
                return
        build = self._build  # the run moved past a resumed segment still unchecked, or
        if self._saved is not None or (build is not None and build.built() >= build.num_steps):
            self._settle()  # one whose last step ran before its whole schedule came
        self._leave_segment()
        self._segment_epoch, self._serial = p.epoch, self._serial + 1
        started = time.perf_counter()
        options = self.pipeline.options  # an explicit global batch: the same on any world
        fixed = options.global_batch_tokens is not None or options.global_batch_samples is not None
        moved = p.segment_world not in (None, world) and p.segment_iteration > 0  # mid-epoch
        ids = begin_segment(p, len(self.pipeline.shapes), world, same_batches=fixed)
        ready = self._ahead.take(p.epoch) if ids is None else None
        if ready is not None:  # built while the last epoch trained: waited for here
            self._schedule_wait_s += ready[1]
            check_segment(p, ready[0])
            self._segment = ready[0]
        else:  # the plan and the epoch's global batches on this thread, the steps on one
            stream = self.pipeline.stream(p.epoch, sample_ids=ids)
            check_length(p, stream.num_steps)
            self._build = StreamedBuild(stream, name=f"schedule-epoch-{p.epoch}")
            if p.segment_fingerprint or p.segment_steps_known:  # else a segment begun here
                self._saved = replace(p, consumed=[], segment_excluded=[])  # its record
            self._check_ran = p.segment_iteration > 0  # a resumed one ran steps of it
            self._steps_checked = not p.segment_steps_known
            self._schedule_wait_s += time.perf_counter() - started
        # a segment begun mid-epoch (on another world) is saved apart from the epoch's
        self._segment_at = p.iterations_done if p.segment_excluded or moved else None

    def _leave_segment(self) -> None:
        """Forget the current segment (its build, if one is streaming, stops) and the
        checks of a resumed one."""
        if self._build is not None:
            self._build.cancel()
        self._segment: Schedule | None = None
        self._build, self._announced, self._expected = None, None, 0
        # a resumed segment streaming: the record it was saved with (checked once whole:
        # its fingerprint, else its first steps'), whether the steps it ran and the first
        # steps saved are checked yet; a refusal of the whole (_check_whole)
        self._saved: Position | None = None
        self._check_ran, self._steps_checked, self._refused = False, True, None

    def _settle(self, wait: bool = True, count: bool = True) -> None:
        """Hold the streamed segment's whole schedule once it is built (``wait``: wait
        for it; ``count``: the seconds go to the next step's ``schedule_wait_s``), its
        fingerprint in the position while the position is in that segment (a resumed
        segment's checked against the saved one, wherever the position is now); then
        announce it (``on_schedule``)."""
        if self._build is not None:
            schedule = self._build.finished()
            if schedule is None and not wait:
                return
            if schedule is None:
                schedule, waited = self._build.schedule()
                self._schedule_wait_s += waited if count else 0.0
            self._check_whole(schedule)
            self._segment, self._build, self._saved = schedule, None, None
            self.resume_unchecked = False  # checked (a refusal raised above)
        if self._segment is not None and self._segment is not self._announced:
            self._announced = self._segment
            if self._on_schedule is not None:
                self._on_schedule(self._segment, self._segment_at)

    def _check_whole(self, schedule: Schedule) -> None:
        """Check the streamed segment's whole ``schedule``: while the position is in that
        segment, against its saved fingerprint (then held there) and, where no step was
        handed out yet (``current_schedule()`` first), the samples of the steps a resumed
        position ran; else against the resumed segment's record. A refusal is kept, so
        that leaving the loop it was raised in does not raise it again."""
        found = self._found("its whole schedule was")
        try:
            if self._in_segment():
                if self._check_ran:  # no step handed out yet (current_schedule() first)
                    world, policy = schedule.world_size, schedule.policy
                    check_steps_run(self.position, schedule.iterations, world, policy)
                    self._check_ran = False
                check_segment(self.position, schedule, found)
            elif self._saved is not None:  # the position has left the segment (its record)
                saved = self._saved
                check_fingerprint(saved.segment_fingerprint, saved.epoch, schedule, found)
                world, policy = schedule.world_size, schedule.policy
                check_known_steps(saved, schedule.iterations, world, policy, found, whole=True)
        except ValueError as err:
            self._refused, self.ran_unchecked = err, self._unchecked()
            raise

    def _iteration(self, k: int) -> Iteration:
        """Step ``k`` of the segment (waited for while it streams: the seconds go to
        its ``schedule_wait_s``; the first of a resumed segment once the steps before it,
        built first, are the ones the position ran; the last of the first steps a
        position saved the fingerprint of, once they are those steps)."""
        if self._segment is not None:
            return self._segment.iterations[k]
        iteration, waited = self._build.step(k)
        self._schedule_wait_s += waited
        world, policy = self.groups.world_size, self.pipeline.policy
        if self._check_ran:
            check_steps_run(self.position, self._build.built_steps(0), world, policy)
            self._check_ran = False
        known = self.position.segment_steps_known
        if not self._steps_checked and k + 1 >= known:  # all built, with step k
            found = self._found(f"its first {known} steps were")
            built = self._build.built_steps(0)
            try:
                checked = check_known_steps(self.position, built, world, policy, found)
            except ValueError:
                self.ran_unchecked = self._unchecked()
                raise
            self._steps_checked = checked
        return iteration

    def _found(self, what: str) -> str:
        """Where a resumed segment's rebuilt schedule was found to differ, for its error:
        the step the run stands after, once ``what`` built, the steps that ran unchecked
        since the saved position, and that position (the one to resume from)."""
        done = self.position.iterations_done
        found = f"found after step {done}, once {what} built"
        unchecked = self._unchecked()
        if unchecked is None:
            return found
        first, saved = unchecked[0], unchecked[0] - 1
        ran = f"step {done}" if done == first else f"steps {first}-{done}"
        return f"{found}: {ran} ran unchecked since the position saved after step {saved}"

    def _unchecked(self) -> tuple[int, int] | None:
        """The steps (first, last) run since the resumed segment's saved position, its
        rebuilt schedule not yet checked (``None``: none)."""
        done = self.position.iterations_done
        saved = self._saved.iterations_done if self._saved is not None else done
        return (saved + 1, done) if saved < done else None

    def _reached(self, epochs: int | None, iterations: int | None) -> bool:
        """Whether the run has completed ``epochs`` epochs or ``iterations`` steps."""
        p = self.position
        return (epochs is not None and p.epoch >= epochs) or (
            iterations is not None and p.iterations_done >= iterations
        )

    def _check_limits(self, epochs: int | None, iterations: int | None) -> None:
        """Refuse a :meth:`steps` call without a limit, or one that has no step to run
        after steps of this object ran: its limits count from the run's start, so a loop
        ``for epoch in range(E): for step in dc.steps(): ...`` trained its first epoch
        only, the others with no step and no word."""
        if epochs is None and iterations is None:
            raise ValueError("steps() needs a limit: epochs, iterations or both")
        if not (self._ran_here and self._reached(epochs, iterations)):
            return
        p = self.position
        raise ValueError(
            f"steps(epochs={epochs}, iterations={iterations}) has no step to run: its limits "
            f"count from the run's start, and the run has done {p.iterations_done} steps "
            f"(epochs completed: {p.epoch}); ask for more (steps(epochs=E) runs every epoch "
            "up to E in one loop, step.epoch naming each step's; per epoch: "
            "steps(epochs=epoch + 1))"
        )

    def steps(
        self,
        epochs: int | None = 1,
        *,
        iterations: int | None = None,
        on_schedule: OnSchedule | None = None,
    ) -> Iterator[Step]:
        """Every optimizer step from :attr:`position` on, until the run has completed
        ``epochs`` epochs or ``iterations`` steps in all (``None``: no such limit).

        Call ``finish()`` on each step before asking for the next: it advances the
        position (the trainer checkpoints it; so can a user loop).

        A segment's steps are built in order away from the loop (a forked process on
        Linux, :class:`~datacentric.train.schedule_ahead.StreamedBuild`) and each is
        handed out once it is built: the first step waits for its own step, not for the
        epoch's (``step.schedule_wait_s``). ``on_schedule(schedule, at_step)`` hears of
        each segment's whole schedule once (``at_step``: the run's step where a segment
        re-planned for another world began, else ``None``), on this thread: at the
        first step after it is built, and at the latest when the loop ends or is left
        (which then waits for it). A resumed segment's rebuilt schedule is checked
        against the saved one there too, with or without ``on_schedule``: a loop never
        ends quietly on a changed schedule.
        """
        self._check_limits(epochs, iterations)
        self._on_schedule = on_schedule
        seen = -1
        try:
            while not self._reached(epochs, iterations):
                self._open_segment()
                self._settle(wait=False)
                p, length = self.position, self.current_length()
                left = length - p.segment_iteration  # steps of this epoch
                if (
                    self._segment is not None
                    and (epochs is None or p.epoch + 1 < epochs)
                    and (iterations is None or p.iterations_done + left < iterations)
                ):  # the run goes on past this epoch: its next schedule, once this one is
                    self._ahead.start(p.epoch + 1)  # whole (a no-op when under way)
                self._expect(fresh=self._serial != seen)
                seen = self._serial
                if p.segment_iteration >= length:
                    p.next_epoch()  # nothing of this epoch left to run
                    continue
                step = Step(
                    self.runtime,
                    self._iteration(p.segment_iteration),
                    number=p.iterations_done,
                    epoch=p.epoch,
                    on_finish=lambda done, n=length: self.position.advance(done.sample_ids, n),
                )
                step.schedule_wait_s, self._schedule_wait_s = self._schedule_wait_s, 0.0
                self._ran_here = True
                yield step
                if not step.finished:
                    raise RuntimeError("call step.finish() before asking for the next step")
        except GeneratorExit:  # the loop was left: its schedule is still announced
            if (on_schedule is not None or self._saved is not None) and self._refused is None:
                self._settle()  # and a resumed segment's checked
            raise
        if on_schedule is not None or self._saved is not None:
            self._settle()
