"""A run's checks before its ranks start, shared by ``train`` and ``bench``: open its
data, build its model on the meta device and check it, size the global batch and check
the ``[validation]`` settings, once; bad input is one line naming the setting. What the
check found is handed on to the ranks (:class:`~datacentric.train.assemble.Prechecked`).
No command owns this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from datacentric.cli.ranks import node_host, say
from datacentric.progress import counted
from datacentric.settings import SchedulingConfig, TrainConfig
from datacentric.settings.command_defaults import command_override
from datacentric.settings.sections import CostConfig, TrainingConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from datacentric.planning.model_specs import ModelSpec
    from datacentric.train.assemble import Prechecked


def check_dataset(config: TrainConfig, command: str) -> Prechecked | None:
    """The check before ranks start, once: open the run's data, build its model on the
    meta device and check it, size the global batch, check the ``[validation]``
    settings. Bad data or a model we cannot run is one line on stderr (None); skipped
    samples and a sized global batch are noted there. Returns what it found, for the
    ranks (:class:`~datacentric.train.assemble.Prechecked`): the same steps as theirs
    (:mod:`datacentric.train.assemble`), not run again."""
    from datacentric.data.base import DataError
    from datacentric.data.diffusion_draws import DiffusionDraws
    from datacentric.data.sources import build_run_data, skipped_note, with_model_tokenizer
    from datacentric.parallel.launch import launch_mode
    from datacentric.planning.heads import ulysses_sp_sizes
    from datacentric.settings.sections import split_fraction
    from datacentric.train.assemble import Prechecked
    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.resume import check_resumable, global_batch_to_train
    from datacentric.train.validation.held_out import training_set_note

    given = config.data.tokenizer
    try:
        check_device(config.parallelism.device)  # before the model is priced on it
        check_profile_dir(config.cost)  # the ranks write their profile there
        data = with_model_tokenizer(config.model, config.data, config.validation)
        if data is not config.data:  # as the ranks read text (assemble_run)
            config = dataclasses.replace(config, data=data)
        draws = DiffusionDraws.of(config.training)  # as the ranks draw (assemble_run)
        dataset, held_out = build_run_data(config.data, config.validation, config.job.seed, draws)
        tokens = [shape.tokens for shape in dataset.shapes()]
        if not (config.checkpoint.resume or config.checkpoint.resume_from):
            split = config.validation.dataset if split_fraction(config.validation.dataset) else None
            held_count = len(held_out) if split and held_out is not None else 0
            check_samples_for_model_check(tokens, split, held_count)  # before the model's check
        check_learned_positions(config, dataset, held_out)  # as well
        if command == "train":  # bench times the steps; it renders nothing
            check_pipeline_objective(config)
        module, shard, held = check_model_holding(config, dataset)
        check_input_shapes(config, module, dataset, held_out)
        if shard is not None:  # the ranks hold it so (Prechecked.shard)
            parallelism = dataclasses.replace(
                config.parallelism, shard=shard, reshard_after_forward=False
            )
            config = dataclasses.replace(config, parallelism=parallelism)
        world = launch_mode(config.parallelism.world).world_size
        sp_sizes = ulysses_sp_sizes(module, world)  # as the ranks' plan (assemble_run)
        sections = (config.scheduling, config.training, config.job, config.checkpoint)
        batch = global_batch_to_train(*sections, dataset.shapes(), sp_sizes, world)  # kept
        spec = analytic_spec(config, module)  # derived once: each plan check prices with it
        options = batch.applied(config.scheduling)
        check_validation(config, options, module, spec, dataset, held_out)
        check_training_fits(config, module, spec, dataset, world)
        if config.checkpoint.resume or config.checkpoint.resume_from:  # as the ranks record it
            recorded = dataclasses.replace(config, scheduling=options).to_json()
            check_resumable(config.checkpoint, Path(config.job.out), recorded, dataset.shapes())
    except (DataError, OSError, ValueError, CheckpointError) as err:
        say(command, refusal(err, command))
        return None
    chosen = config.data.tokenizer
    if given is None and chosen is not None:
        say(
            command,
            f"note: text read with the model's own tokenizer, {chosen} (--tokenizer sets another)",
        )
    same_set = training_set_note(config.data, config.validation)
    warmup = warmup_note(config.training, options, dataset.shapes(), config.job.seed, world)
    for note in (held, skipped_note(dataset), batch.note, same_set, warmup):
        if note:
            say(command, f"note: {note}")
    if config.metrics.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            say(
                command,
                "metrics.wandb: the wandb package is not installed; "
                "pip install 'datacentric[wandb]' or leave --wandb off",
            )
            return None
    return Prechecked(batch, data=(dataset, held_out), shard=shard)


def refusal(err: Exception, command: str) -> str:
    """``err``'s line; where it is a global batch below the longest sample and the batch
    is ``command``'s own (its ``tokens_per_iteration`` in ``COMMAND_DEFAULTS``, which no
    flag of it sets), the fix the command takes: a shorter ``--max-tokens``. Data or a
    file this node cannot read (``DataError``, ``OSError``) on a job of several nodes
    is named with its host (:func:`~datacentric.cli.ranks.node_host`)."""
    from datacentric.data.base import DataError
    from datacentric.scheduling.global_batches import BatchBelowLongest

    host = node_host()
    if host is not None and isinstance(err, (DataError, OSError)):
        return f"host {host}: {err}"
    own = command_override(command, "tokens_per_iteration")
    if not isinstance(err, BatchBelowLongest) or own is None or err.bound != own.value:
        return str(err)
    return (
        f"{command}'s global batch of {err.bound:,} tokens (its own: {own.reason}; no flag "
        f"sets it) is smaller than the longest sample ({err.longest:,} tokens); give "
        f"--max-tokens {err.bound} or less"
    )


def warmup_note(
    training: TrainingConfig, options: SchedulingConfig, shapes, seed: int, world: int
) -> str | None:
    """A note when the learning-rate warm-up (``warmup_iterations``) is longer than the
    run (``iterations``, else ``epochs`` epochs of the global batches of ``options``,
    the sized one included, on ``world`` ranks): the rate then never reaches
    ``training.lr`` (its last step's share of it is said); ``None`` otherwise."""
    from datacentric.scheduling.global_batches import steps_per_epoch

    warmup, steps = training.warmup_iterations, training.iterations
    if warmup <= (steps or training.epochs):  # an epoch is one step or more
        return None
    if steps is None:
        steps = training.epochs * steps_per_epoch(shapes, options, seed=seed, world_size=world)
    if warmup <= steps:
        return None
    return (
        f"training.warmup_iterations {warmup} is more than the run's {counted(steps, 'step')}: the "
        f"learning rate stays in its warm-up and reaches {steps / warmup:.3g} of training.lr "
        "at the last step (--warmup-iterations sets it)"
    )


def ranks_device(device: str | None, world: int | None) -> torch.device:
    """The device the run's first rank computes on, as the launch places its ranks
    (``parallelism.device`` and ``world``): one process on ``device`` (else cuda when
    available), ranks of NCCL on their GPUs, ranks of gloo (more local ranks than GPUs,
    or ``device`` the CPU) on the CPU; the plan checks price and budget on it."""
    import os

    from datacentric.parallel.groups import backend_for, default_device, device_for_backend
    from datacentric.parallel.launch import launch_mode

    mode = launch_mode(world)
    if mode.kind == "single":
        return default_device(device)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if mode.kind == "torchrun" else world
    return device_for_backend(backend_for(local, device), 0)


def check_profile_dir(cost: CostConfig) -> None:
    """Raise ``ValueError`` naming ``cost.profile_dir`` when the profile's folder of a
    ``profile`` cost model is a file, or lies under one: the ranks would fail to save
    the profile there (``FileExistsError``) after measuring it."""
    if cost.cost_model != "profile" or cost.profile_dir is None:
        return
    folder = Path(cost.profile_dir)
    blocking = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        what = "is a file" if blocking == folder else f"lies under the file {blocking}"
        raise ValueError(
            f"cost.profile_dir: {folder} {what}; name a folder for the profile "
            "(--profile-dir DIR), or leave it unset (the run's <out>/profile)"
        )


def check_device(device: str | None) -> None:
    """Raise ``ValueError`` naming ``parallelism.device`` when it names a CUDA device
    this machine does not have (torch built without CUDA, no GPU, or an index past the
    last): the run would fail on it at its first use instead."""
    import torch

    if device is None or torch.device(device).type != "cuda":
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (torch.device(device).index or 0) < count:
        return
    have = f"{count} CUDA device(s), cuda:0 to cuda:{count - 1}" if count else "no CUDA device"
    raise ValueError(
        f"parallelism.device: {device} is not a device of this machine ({have}); pass "
        "--device cpu, or leave it unset (cuda when available, else the CPU)"
    )


def check_model_holding(config: TrainConfig, dataset) -> tuple[nn.Module, str | None, str | None]:
    """The run's model checked (:func:`~datacentric.train.build.check_model`, on the meta
    device), the ``shard`` its ranks hold it with instead of the settings' (``ddp`` for a
    model whose forward calls a block more than once, which FSDP2 cannot hold; ``None``:
    the settings'), and the note that says so."""
    from datacentric.models.source import DataKindError, inner_pretrained
    from datacentric.train.build import BlockReuseError, check_model

    settings = dict(lora=config.lora, parallelism=config.parallelism, cost=config.cost)
    try:
        return check_model(config.model, dataset, **settings), None, None
    except DataKindError as err:  # named by the settings that chose the model and data
        line = err.named(f"--model {config.model.model}", f"--dataset {config.data.dataset}")
        raise ValueError(line) from None
    except BlockReuseError as err:  # FSDP2 gathers a block once per call: DDP holds it
        note = (
            f"{type(inner_pretrained(err.module) or err.module).__name__} calls block "
            f"{err.index} {err.count} "
            "times in one forward, and FSDP2 gathers a block once per call: the model is "
            "held with DDP (--shard ddp; --shard none holds it whole on each rank)"
        )
        return err.module, "ddp", note


def check_input_shapes(config: TrainConfig, module: nn.Module, dataset, held_out) -> None:
    """Raise ``ValueError`` naming the model, the sample and the setting when a latent of
    the training set or of the held-out set (``held_out``; None: none) is not whole
    patches of the model's (``module``, on the meta device;
    :func:`~datacentric.verify.model_contract.check_latent_patches`)."""
    from datacentric.verify.model_contract import check_latent_patches

    where = f"validation.dataset {config.validation.dataset}: " if config.validation.dataset else ""
    for samples, prefix in ((dataset, ""), (held_out, where)):
        try:
            if samples is not None:
                check_latent_patches(module, samples)
        except ValueError as err:
            raise ValueError(f"{prefix}model {config.model.model!r}: {err}") from None


def check_pipeline_objective(config: TrainConfig) -> None:
    """Raise ``ValueError`` naming the model and its scheduler when a diffusers model
    folder sits in a pipeline that does not sample by flow matching
    (:func:`~datacentric.models.model_args.check_pipeline_scheduler`); a model string
    that does not resolve passes (the model's own check names what is wrong)."""
    from datacentric.models.model_args import check_pipeline_scheduler
    from datacentric.models.source import ModelSourceError, resolve_model

    try:
        source = resolve_model(config.model.model, config.model.model_args)
    except ModelSourceError:
        return
    if source.kind == "diffusers" and source.folder is not None:
        check_pipeline_scheduler(config.model.model, source.pipeline or source.folder)


def check_learned_positions(config: TrainConfig, dataset, held_out) -> None:
    """Raise ``ValueError`` naming the sample, its source and the setting when a sample of
    the training or held-out set is longer than the position table of a transformers model
    that learns one (GPT-2's ``n_positions``, OPT's ``max_position_embeddings``; read off
    the model's config, before the model's own check packs samples): its positions start
    again at each sample, but past the table its embedding fails (``IndexError: index out
    of range in self``). Rotary models, which compute their angles, pass; so does a
    model string the config cannot be read for (the model's check names what is wrong)."""
    from datacentric.models.source import ModelSourceError, resolve_model
    from datacentric.planning.spec_derivation import LEARNED_POSITION_TYPES

    try:
        source = resolve_model(config.model.model, config.model.model_args)
        if source.kind != "hf":
            return
        from datacentric.models.hf import source_config

        model = source_config(source)
    except ModelSourceError:
        return
    if getattr(model, "model_type", None) not in LEARNED_POSITION_TYPES:
        return
    key = "n_positions" if getattr(model, "n_positions", None) else "max_position_embeddings"
    limit = int(getattr(model, key))
    where = f"validation.dataset {config.validation.dataset}: " if config.validation.dataset else ""
    for samples, prefix in ((dataset, ""), (held_out, where)):
        tokens = [shape.tokens for shape in samples.shapes()] if samples is not None else []
        longest = max(range(len(tokens)), key=tokens.__getitem__, default=None)
        if longest is None or tokens[longest] <= limit:
            continue
        source_of = getattr(samples, "sample_source", None)
        sample = f"sample {longest}" + (f" ({source_of(longest)})" if callable(source_of) else "")
        raise ValueError(
            f"{prefix}model {config.model.model!r}: {sample} has {tokens[longest]:,} tokens, "
            f"more than the {limit:,} positions {type(model).__name__.removesuffix('Config')} "
            f"learns ({key} in its config): pass --max-tokens {limit} or less (a longer "
            "document is then cut as --long-docs says)"
        )


def check_validation(
    config: TrainConfig,
    options: SchedulingConfig,
    module: nn.Module,
    spec: ModelSpec | None,
    dataset,
    held_out,
) -> None:
    """Raise ``ValueError`` naming the ``[validation]`` setting that cannot work: held-out
    samples with no loss-carrying token or, longer than every training sample, a shape
    the plan cannot fit (the analytic plan of the run's model, world and memory budget;
    the run's own plan of the held-out set, made when its ranks start, decides the rest),
    a prompts file that is not text or a
    model with no logits to continue it, ``every`` past the run's last step (counted from
    its global batches when ``iterations`` is unset: ``options``, the sized global batch
    included). ``module``: the run's model on the meta device; ``spec``: its analytic
    spec (:func:`analytic_spec`)."""
    from datacentric.parallel.launch import launch_mode
    from datacentric.scheduling.global_batches import steps_per_epoch

    validation = config.validation
    world = launch_mode(config.parallelism.world).world_size  # torchrun's, else --world
    if held_out is not None:
        where = f"validation.dataset {validation.dataset}"
        if not sum(held_out.loss_tokens(i) for i in range(len(held_out))):
            raise ValueError(f"{where}: the held-out samples carry no loss token")
        longest = max(shape.tokens for shape in dataset.shapes())
        if max(shape.tokens for shape in held_out.shapes()) > longest:
            # longer than every training sample: may not fit where training does
            check_held_out_fits(where, held_out, config, module, spec, world)
        check_held_out_batches(where, held_out, config, options, module)
    if validation.prompts is not None:
        check_prompts(config, module)
    every, training = validation.every, config.training
    if every and training.iterations is None:
        per_epoch = steps_per_epoch(
            dataset.shapes(), options, seed=config.job.seed, world_size=world
        )
        if every > per_epoch * training.epochs:
            raise ValueError(
                f"validation.every: {every} is more than the run's "
                f"{counted(per_epoch * training.epochs, 'step')} "
                f"({counted(training.epochs, 'epoch')} of {per_epoch}): validation would run only "
                "after the last step; lower it"
            )


def check_prompts(config: TrainConfig, module: nn.Module) -> None:
    """The prompts file reads as text (:func:`~datacentric.data.prompts.read_prompts`)
    and the model (``module``, on the meta device) has next-token logits to continue
    it with, or a ``pipeline`` renders for it (:func:`check_render_pipeline`)."""
    from datacentric.data.prompts import check_prompt_tokens, read_prompts
    from datacentric.data.tokenizer_files import TextCodec

    prompts = read_prompts(config.validation.prompts)
    if config.validation.pipeline is not None:
        check_render_pipeline(config, module)
        return
    if not callable(getattr(module, "logits", None)):
        raise ValueError(
            f"validation.prompts: {config.model.model} has no next-token logits to generate "
            "with (a text model: hf:DIR); leave validation.prompts unset"
        )
    positions = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    limit = min(config.data.max_tokens, positions or config.data.max_tokens)
    encode = TextCodec(config.data.tokenizer).encode
    where = f"validation.prompts {config.validation.prompts}"
    check_prompt_tokens(prompts, encode, config.validation.max_new_tokens, limit, where)


def check_render_pipeline(config: TrainConfig, module: nn.Module) -> None:
    """The ``validation.pipeline`` folder is a pipeline of the class of the transformer
    ``module`` holds (on the meta device) and renders the requested size and frames, the
    section's and each prompt's (:meth:`PipelineSamples.check
    <datacentric.train.validation.renders.PipelineSamples.check>`)."""
    from datacentric.train.validation.renders import PipelineSamples

    samples = PipelineSamples.of(config.validation, config.job.seed, config.job.out)
    if samples is not None:
        samples.check(module)


def check_held_out_batches(
    where: str, held_out, config: TrainConfig, options: SchedulingConfig, module: nn.Module
) -> None:
    """Raise ``ValueError`` starting with ``where`` when the held-out set's one pass,
    cut as its schedule cuts it (the run's global batch, ``options``, the sized one
    included, raised to cover the held-out samples:
    :func:`~datacentric.scheduling.global_batches.held_out_batch`), has a batch the
    world's groups cannot share (:func:`~datacentric.scheduling.global_batches.
    check_global_batch`): fewer held-out samples than the groups need."""
    from datacentric.parallel.launch import launch_mode
    from datacentric.planning.heads import ulysses_sp_sizes
    from datacentric.scheduling.global_batches import check_global_batch, held_out_batch

    world = launch_mode(config.parallelism.world).world_size
    largest = max(ulysses_sp_sizes(module, world), default=1)
    shapes = held_out.shapes()
    tokens = [shape.tokens for shape in shapes]
    try:
        check_global_batch(
            held_out_batch(options, tokens, world_size=world, largest_sp=largest),
            shapes,
            world_size=world,
            largest_sp=largest,
            seed=config.job.seed,
            epochs=1,
        )
    except ValueError as err:
        raise ValueError(f"{where}: held-out samples: {err}") from None


def check_held_out_fits(
    where: str, held_out, config: TrainConfig, module: nn.Module, spec: ModelSpec | None, world: int
) -> None:
    """Raise ``ValueError`` starting with ``where`` when a held-out sample's shape fits
    no configuration of the plan (:func:`analytic_pipeline`, priced forward only as
    validation runs it)."""
    shapes = held_out.shapes()
    pipeline = analytic_pipeline(shapes, config, module, spec, world, forward_only=True)
    if pipeline is None:
        return  # no analytic price: the run's own plan decides
    try:
        _ = pipeline.plan
    except ValueError as err:
        raise ValueError(f"{where}: a held-out sample cannot be planned: {err}") from None


def check_training_fits(
    config: TrainConfig, module: nn.Module, spec: ModelSpec | None, dataset, world: int
) -> None:
    """Raise ``ValueError`` naming the bucket, its longest sample, the GiB it needs and
    the budget, and the flags of ``train`` that help, when a bucket of the training set
    fits no configuration of the plan (:func:`analytic_pipeline`) under the memory
    budget, even on the largest SP size with every block recomputed."""
    from datacentric.train.assemble import check_plan

    shapes = dataset.shapes()
    pipeline = analytic_pipeline(shapes, config, module, spec, world, forward_only=False)
    if pipeline is None:
        return  # no analytic price: the run's own plan decides
    check_plan(pipeline, "analytic")


def analytic_spec(config: TrainConfig, module: nn.Module) -> ModelSpec | None:
    """The analytic spec of the run's model (``module``, on the meta device) that the
    plan checks price with, derived once; ``None`` when the model has no analytic price
    (the run's own plan decides)."""
    from datacentric.planning.spec_derivation import UnpricedModelError, spec_of_model

    try:
        return spec_of_model(module, config.model.model)
    except UnpricedModelError:
        return None


def analytic_pipeline(
    shapes,
    config: TrainConfig,
    module: nn.Module,
    spec: ModelSpec | None,
    world: int,
    forward_only: bool,
):
    """The analytic :class:`~datacentric.scheduling.pipeline.Pipeline` of ``shapes`` for
    the run's model (``module``, on the meta device; ``spec``: its
    :func:`analytic_spec`) on ``world`` ranks of this machine's device, under ``[cost]
    memory_gb`` (else 70% of the device), with the SP sizes its ranks plan with;
    ``forward_only``: priced as validation runs it. ``None`` when the model has no
    analytic price (``spec`` None)."""
    from datacentric.parallel.groups import device_memory_bytes
    from datacentric.planning.forward_only import ForwardOnlyCostModel
    from datacentric.planning.heads import ulysses_sp_sizes
    from datacentric.planning.memory_cap import resolve_memory_cap
    from datacentric.scheduling.pipeline import Pipeline
    from datacentric.train.build import device_cost_model, sharding

    if spec is None:
        return None
    device = ranks_device(config.parallelism.device, config.parallelism.world)
    shard = sharding(config.parallelism)
    cost_model = device_cost_model(spec, device, config.model.dtype, shard=shard, world_size=world)
    if forward_only:
        cost_model = ForwardOnlyCostModel(cost_model)  # as the validation schedule prices it
    budget = resolve_memory_cap(config.cost.memory_gb, device_memory_bytes(device, world))
    return Pipeline(
        shapes,
        cost_model,
        world_size=world,
        memory_cap_bytes=budget,
        sp_sizes=ulysses_sp_sizes(module, world),
    )


def check_samples_for_model_check(
    tokens: list[int], split: str | None = None, held: int = 0
) -> None:
    """Raise ``ValueError`` naming the data settings when the dataset has fewer than the
    two samples of 4 tokens or more that the model check of a fresh run packs together
    (:func:`~datacentric.verify.model_contract.check_model_contract`), e.g. one sample
    for two ranks, or documents cut into pieces of 3 tokens (``--max-tokens 3``).
    ``tokens``: the training set's, after a ``[validation] dataset`` of ``split``
    (``split=FRACTION``; None: none) held out ``held`` samples, which it then names."""
    usable = sum(1 for t in tokens if t >= 4)
    if usable < 2:
        longer = " or longer samples (data.max_tokens)" if len(tokens) > 2 else ""
        after = f", after validation.dataset {split} held out {held}" if split else ""
        fewer = ", or hold out fewer (validation.dataset)" if split else ""
        raise ValueError(
            f"the dataset has {counted(usable, 'sample')} of 4 tokens or more ({len(tokens)} in all"
            f"{after}); training checks the model on 2 such samples packed together before "
            f"the ranks start: give more data (data.dataset, data.dataset_limit){longer}{fewer}"
        )
