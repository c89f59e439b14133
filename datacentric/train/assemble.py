"""The one assembly of a training run, in the order a run is built.

::

    settings -> data -> model source and spec -> global batch size -> plan -> schedule
             -> runtime -> trainer

1. **settings**: the resolved :class:`~datacentric.settings.TrainConfig` (the command
   line, ``--config`` and defaults; resolved by the caller, before ranks start), with
   the tokenizer text is read with
   (:func:`~datacentric.data.sources.with_model_tokenizer`: unset, an ``hf:DIR``
   model's own), which the run records, and this rank's process groups
   (:func:`~datacentric.parallel.groups.process_groups` from the ``[parallelism]``
   section, unless the caller made them), which everything after is built on;
2. **data**: the ``[data]`` section opens the dataset, the ``[validation]`` section its
   held-out samples, opened in one place of ``data/``
   (:func:`~datacentric.data.sources.build_run_data`);
3. **model source and spec**: the ``[model]`` and ``[lora]`` sections build the model,
   every rank the same weights from the seed (:func:`build_run_model`), held with its
   description as one :class:`~datacentric.train.build.RunModel` (the resolved source,
   its arguments and adapters, the dtype): its spec and cost model come from the one
   lookup and derivation of a model's spec
   (:func:`~datacentric.profiling.factory.named_spec`,
   :mod:`datacentric.planning.spec_derivation`; :func:`run_cost_model` takes the
   ``RunModel`` and the ``[cost]`` section), and so does the analytic model the step
   records' ``mfu`` is counted on, read off the built model before its LoRA adapters
   are injected (:func:`mfu_cost_model`: the model is not built again, not even on
   the meta device);
4. **global batch size**: a small dataset's global batch sized from its samples when
   the ``[scheduling]`` section gives none
   (:func:`~datacentric.scheduling.global_batches.size_global_batch`), recorded in the
   run's settings (:attr:`Run.config`);
5. **plan**, 6. **schedule**, 7. **runtime**: :class:`DataCentric`, which receives the
   built model and dataset, holds the model (to the device, the contract check,
   compilation, DDP/FSDP2), plans the dataset once under the memory budget, builds each
   epoch's schedule and the runtime that runs it. A user's ``DataCentric(model,
   dataset)`` runs these same steps from the model spec on;
8. **trainer**: each rank's own random stream, the step metrics and the optimizer.

The check before the ranks start (``datacentric train``: ``cli/precheck.check_dataset``)
runs steps 2 to 4 once (the model on the meta device) and hands what it found on as a
:class:`Prechecked`, an argument of the launch: the global batch it sized, and the
datasets it opened to a rank running in its own process, so that each dataset is
opened once per process and nothing is decided twice.

:func:`assemble_run` is called by the trainer (:class:`~datacentric.train.trainer.Trainer`),
so by ``datacentric train``, and by ``bench`` and ``demo`` through the measured
comparison (:mod:`datacentric.train.comparison.measured_comparison`), which trains every policy
with the trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from datacentric.data.base import Dataset
from datacentric.data.diffusion_draws import DiffusionDraws
from datacentric.data.sources import build_run_data, reads_text, with_model_tokenizer
from datacentric.data.tokenizer_files import BYTES
from datacentric.parallel.groups import ProcessGroups, process_groups
from datacentric.planning.hardware import gib_text
from datacentric.planning.heads import ulysses_sp_sizes
from datacentric.planning.planner import UnfittableBucketError
from datacentric.progress import counted
from datacentric.scheduling.global_batches import GlobalBatchSize, run_global_batch
from datacentric.scheduling.pipeline import Pipeline
from datacentric.settings import TrainConfig
from datacentric.settings.sections import DataConfig, ModelConfig, ValidationConfig
from datacentric.train.build import RunPlace, build_run_model, run_cost_model, sharding
from datacentric.train.data_centric import DataCentric
from datacentric.train.rank_agreement import check_same_run
from datacentric.train.reporting.metrics import StepMetrics


@dataclass
class Prechecked:
    """What the check before the ranks start found, handed to every rank as an argument
    of the launch (so a rank decides nothing twice): the global batch it sized and,
    to a rank in the checking process itself (one process, torchrun), the datasets it
    opened. Pickled to a spawned rank, it carries no dataset: that rank opens its own."""

    global_batch: GlobalBatchSize
    """The global-batch step's result
    (:func:`~datacentric.scheduling.global_batches.run_global_batch`)."""
    shard: str | None = None
    """How the check chose to hold the model instead of the settings' ``shard`` (``ddp``
    for a model that calls a block more than once, which FSDP2 cannot hold); ``None``:
    as the settings say."""
    data: tuple[Dataset, Dataset | None] | None = field(default=None, compare=False)
    """``(training set, held-out set or None)`` as opened in the checking process."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "data": None}  # a dataset stays in its own process


@dataclass
class Run:
    """What :func:`assemble_run` built for one rank, in the order it built it."""

    config: TrainConfig
    """The run's settings, as the run records them (the sized global batch included)."""
    groups: ProcessGroups
    """This rank's process groups (the caller's, else made from ``[parallelism]``)."""
    dataset: Dataset
    """The run's samples."""
    module: nn.Module
    """The user's module, before it is wrapped or sharded."""
    dc: DataCentric
    """The plan, each epoch's schedule, the held model and the runtime."""
    step_metrics: StepMetrics
    """What each step record adds beyond loss and speed."""
    optimizer: torch.optim.Optimizer
    """AdamW over the held model's parameters (``dc.model``)."""
    held_out: Dataset | None = None
    """The ``[validation]`` section's held-out samples (None: no validation)."""


def tokenizer_used(
    model: ModelConfig, data: DataConfig, validation: ValidationConfig
) -> str | None:
    """What the run's text is read with, as ``train --json`` reports it: the tokenizer's
    path, ``bytes``, or ``None`` when the run reads no text."""
    if not reads_text(data, validation):
        return None
    return with_model_tokenizer(model, data, validation).tokenizer or BYTES


def assemble_run(
    config: TrainConfig,
    groups: ProcessGroups | None = None,
    prechecked: Prechecked | None = None,
) -> Run:
    """Build everything one rank's run needs, in the order of the module doc, reusing
    what the check before the ranks start found (``prechecked``; None: no check ran).
    ``groups``: this rank's process groups (None: made from the ``[parallelism]`` section)."""
    # process groups: where this rank stands in the world, before anything is built on it
    parallelism = config.parallelism
    groups = groups or process_groups(parallelism.collective_timeout_s, parallelism.device)
    # the data's settings: how a latent dataset draws captions and times, the tokenizer
    draws = DiffusionDraws.of(config.training)
    data = with_model_tokenizer(config.model, config.data, config.validation)
    if data is not config.data:  # the run records the tokenizer it reads with
        config = dataclasses.replace(config, data=data)
    if prechecked is not None and prechecked.shard is not None:  # and the holding it runs
        held = dataclasses.replace(
            config.parallelism, shard=prechecked.shard, reshard_after_forward=False
        )
        config = dataclasses.replace(config, parallelism=held)
    seed = config.job.seed
    # data: the training set, without the [validation] section's held-out samples
    found = prechecked.data if prechecked is not None else None
    dataset, held_out = found or build_run_data(config.data, config.validation, seed, draws)
    check_same_run(groups, config.to_json(), dataset.shapes())  # before any other collective
    torch.manual_seed(seed)  # model: every rank draws the same weights
    # the model, and the analytic model mfu counts on, read off it before its adapters
    run_model = build_run_model(config.model, dataset, groups.device, lora=config.lora)
    module = run_model.module
    sp_sizes = ulysses_sp_sizes(module, groups.world_size)  # for the profile and the plan
    shard = sharding(config.parallelism)  # how model state is held: priced and run
    place = RunPlace(  # where it trains and on what, as its cost model reads them
        groups.device,
        groups.world_size,
        shard,
        config.job,
        progress=config.metrics.progress and groups.rank == 0,
        shapes=dataset.shapes(),
        dataset=dataset,
        sp_sizes=sp_sizes,
        ranks_per_node=groups.ranks_per_node,
    )
    resumed = bool(config.checkpoint.resume or config.checkpoint.resume_from)
    cost_model = run_cost_model(run_model.placed(place), config.cost, resumed=resumed)  # collective
    # global batch size: the check's, else sized here from the same samples
    batch = prechecked.global_batch if prechecked is not None else None
    if batch is None:
        sections = (config.scheduling, config.training, seed, dataset.shapes())
        batch = run_global_batch(*sections, sp_sizes, groups.world_size)
    scheduling = batch.applied(config.scheduling)
    if scheduling is not config.scheduling:  # the run records the batch it trains
        config = dataclasses.replace(config, scheduling=scheduling)
    dc = DataCentric(  # plan, schedule, runtime: the steps a user's DataCentric runs
        module,
        dataset,
        policy=scheduling.policy,
        cost_model=cost_model,
        memory_gb=config.cost.memory_gb,
        seed=seed,
        groups=groups,
        shard=shard,
        options=scheduling,
        compile=config.training.compile,
        sp_sizes=sp_sizes,
        # a resumed run keeps the model and data its first start checked (the resume
        # checks refuse any change), and names a changed model by the checkpoint's
        check_model=not resumed,
    )
    check_plan(dc.pipeline, config.cost.cost_model)  # now, its refusal train's own line
    # trainer: each rank's own random stream from here (dropout differs by rank and shard)
    torch.manual_seed(seed + 1 + groups.rank)
    step_metrics = StepMetrics(dc, groups, run_model.mfu)
    optimizer = torch.optim.AdamW(
        dc.model.parameters(),  # wrapped or sharded: the optimizer takes its parameters
        lr=config.training.lr,
        betas=config.training.betas,
        weight_decay=config.training.weight_decay,
    )
    return Run(config, groups, dataset, module, dc, step_metrics, optimizer, held_out)


def check_plan(pipeline: Pipeline, cost_model: str) -> None:
    """Make the plan of the run's training set (``pipeline``'s; priced by the ``[cost]``
    section's ``cost_model``): a bucket that fits no configuration under the memory
    budget raises ``ValueError`` with :func:`unfittable_line`. The check before the
    ranks start priced the plan analytically; a profile measured on the ranks may price
    a sample's memory above it."""
    try:
        _ = pipeline.plan
    except UnfittableBucketError as err:
        priced = ", as the run's profile measured it," if cost_model == "profile" else ""
        raise ValueError(unfittable_line(err, pipeline, priced)) from None


def unfittable_line(err: UnfittableBucketError, pipeline: Pipeline, priced: str = "") -> str:
    """``train``'s line for a bucket of ``pipeline`` that fits no configuration under
    its memory budget (``err``): the bucket, its longest sample, the GiB it needs
    (``priced``: by what, said after the GiB) and the budget, and the flags of ``train``
    that help."""
    bucketing = pipeline.bucketing
    index = next(i for i, b in enumerate(bucketing.buckets) if b.name == err.bucket)
    longest = max(bucketing.members()[index], key=lambda i: pipeline.shapes[i].tokens)
    shape = pipeline.shapes[longest]
    shorter = ", or shorter samples (--max-tokens)" if not shape.is_video else ""
    return (
        f"cost.memory_gb: bucket {err.bucket!r} (its longest sample: sample {longest}, "
        f"{shape.tokens:,} tokens) needs {gib_text(err.needed_bytes)} GiB per rank{priced} "
        f"even on {counted(err.sp_size, 'rank')} with every block recomputed, above the "
        "memory budget "
        f"of {gib_text(err.cap_bytes)} GiB per rank; raise --memory-gb, give more ranks "
        f"(--world){shorter}"
    )
