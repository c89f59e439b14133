"""The one assembly of a training run, in the order a run is built.

::

    settings -> data -> model -> plan -> schedule -> runtime -> trainer

1. **settings**: the resolved :class:`~datacentric.settings.TrainConfig` (the command
   line, ``--config`` and defaults; resolved by the caller, before ranks start);
2. **data**: the ``[data]`` section opens the dataset, the ``[validation]`` section its
   held-out samples (:func:`~datacentric.train.validation.build_run_data`);
3. **model**: the ``[model]`` and ``[lora]`` sections build the model, every rank the
   same weights from the seed (:func:`build_model_for`); its spec and cost model come
   from the one derivation of a model's spec
   (:mod:`datacentric.profiling.module_specs`, :func:`run_cost_model`);
4. **plan**, 5. **schedule**, 6. **runtime**: :class:`DataCentric`, which receives the
   built model and dataset, holds the model (to the device, the contract check,
   compilation, DDP/FSDP2), plans the dataset once under the memory budget, builds each
   epoch's schedule and the runtime that runs it. A user's ``DataCentric(model,
   dataset)`` runs these same steps from the model spec on;
7. **trainer**: each rank's own random stream, the step metrics (with the analytic
   model their ``mfu`` is counted on, :func:`mfu_cost_model`) and the optimizer.

:func:`assemble_run` is called by the trainer (:class:`~datacentric.train.trainer.Trainer`),
so by ``datacentric train``, and by ``bench`` and ``demo`` through the measured
comparison (:mod:`datacentric.train.measured_comparison`), which trains every policy
with the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from datacentric.data.base import Dataset
from datacentric.parallel.groups import ProcessGroups
from datacentric.settings import TrainConfig
from datacentric.train.build import (
    build_model_for,
    mfu_cost_model,
    run_cost_model,
    sharding,
)
from datacentric.train.data_centric import DataCentric, ulysses_sp_sizes
from datacentric.train.metrics import StepMetrics
from datacentric.train.validation import build_run_data


@dataclass
class Run:
    """What :func:`assemble_run` built for one rank, in the order it built it."""

    config: TrainConfig
    """The run's settings."""
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


def assemble_run(config: TrainConfig, groups: ProcessGroups) -> Run:
    """Build everything one rank's run needs, in the order of the module doc."""
    torch.manual_seed(config.job.seed)  # every rank draws the same weights
    # data: the training set, without the [validation] section's held-out samples
    dataset, held_out = build_run_data(config.data, config.validation, config.job.seed)
    module = build_model_for(config.model, dataset, lora=config.lora)  # model
    cost_model = run_cost_model(  # the model's cost (collective when it profiles)
        config.cost,
        groups.world_size,
        groups.device,
        dataset.shapes(),
        model_settings=config.model,
        lora=config.lora,
        parallelism=config.parallelism,
        job=config.job,
        progress=config.metrics.progress,
        is_main=groups.rank == 0,
        model=module,
        dataset=dataset,
        sp_sizes=ulysses_sp_sizes(module, groups.world_size),
    )
    dc = DataCentric(  # plan, schedule, runtime: the steps a user's DataCentric runs
        module,
        dataset,
        policy=config.scheduling.policy,
        cost_model=cost_model,
        memory_gb=config.cost.memory_gb,
        tokens_per_iteration=config.scheduling.tokens_per_iteration,
        seed=config.job.seed,
        groups=groups,
        shard=sharding(config.parallelism),
        options=config.scheduling.options(),
        compile=config.training.compile,
        # a resumed run keeps the model and data its first start checked (the resume
        # checks refuse any change), and names a changed model by the checkpoint's
        check_model=not (config.checkpoint.resume or config.checkpoint.resume_from),
    )
    # trainer: the weights are drawn; from here each rank draws its own random stream, so
    # a model's dropout masks differ between ranks (and between an SP group's shards).
    torch.manual_seed(config.job.seed + 1 + groups.rank)
    step_metrics = StepMetrics(dc, groups, mfu_cost_model(config.model, groups.device))
    optimizer = torch.optim.AdamW(
        dc.model.parameters(),  # wrapped or sharded: the optimizer takes its parameters
        lr=config.training.lr,
        betas=config.training.betas,
        weight_decay=config.training.weight_decay,
    )
    return Run(config, dataset, module, dc, step_metrics, optimizer, held_out)
