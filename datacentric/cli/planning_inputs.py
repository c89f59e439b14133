"""What the planning commands (``plan``, ``schedule``, ``simulate``, ``profile``) build
from their flags: the dataset's sample shapes, the cost model (analytic, or fitted to a
saved profile) with its sharding, the memory budget per rank, the global batch options
and the :class:`~datacentric.scheduling.pipeline.Pipeline` of them all. No command owns
this module; each command's own module imports it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from datacentric.cli.flag_groups import add_memory_flags, add_shard_flags, lora_of_args
from datacentric.shapes import SampleShape, read_lengths_file

#: The refusal of a command whose samples come from nowhere.
NO_DATA = "give --dataset SPEC or --lengths FILE"


def data_named(args: argparse.Namespace) -> str:
    """What the samples come from, as a command's first line names it: ``--lengths
    FILE`` or ``--dataset SPEC``, the one :func:`dataset_shapes` reads; ``ValueError``
    when neither is given (or the ``--config`` file's ``dataset``), so that the command
    refuses before a first line that names no data."""
    named = getattr(args, "lengths", None) or args.dataset
    if not named:
        raise ValueError(NO_DATA)
    return named


def dataset_shapes(args: argparse.Namespace) -> tuple[list[SampleShape], int]:
    """Sample shapes of ``--dataset SPEC`` (any source of
    :func:`~datacentric.data.sources.open_dataset`, shaped by the data flags; text read
    with the tokenizer ``train`` reads it with:
    :func:`~datacentric.data.sources.with_model_tokenizer`) or of ``--lengths FILE``, and
    how many samples the dataset skipped on request."""
    if getattr(args, "lengths", None):
        return read_lengths_file(args.lengths), 0
    if args.dataset:
        from datacentric.data.workloads import preset_shapes

        settings = args.settings
        shapes = preset_shapes(args.dataset, settings.job.seed, settings.data.dataset_limit)
        if shapes is not None:  # open_dataset's shapes, without torch's import
            return shapes, 0
        from datacentric.cli.ranks import say
        from datacentric.data.sources import (
            open_dataset,
            reads_text,
            skipped_samples,
            with_model_tokenizer,
        )

        # text read with the tokenizer train reads it with (an hf:DIR model's own)
        data = with_model_tokenizer(settings.model, settings.data, settings.validation)
        dataset = open_dataset(args.dataset, data, seed=settings.job.seed)
        if reads_text(data, settings.validation) and data.tokenizer is None:  # not chosen
            say(
                args.command,
                f"note: {args.dataset}: lengths counted in UTF-8 bytes, no tokenizer given "
                "(--tokenizer DIR counts your model's tokens; --tokenizer bytes says so)",
            )
        return dataset.shapes(), skipped_samples(dataset)
    raise ValueError(NO_DATA)


def add_cost_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The memory budget and the sharding of the commands that build an analytic cost
    model (see :func:`analytic_model`)."""
    add_memory_flags(parser)
    add_shard_flags(parser)


def sharding_of(args: argparse.Namespace) -> Any:
    """The :class:`~datacentric.planning.sharding.ShardingSpec` of ``--shard`` flags."""
    from datacentric.planning.sharding import DEFAULT_SHARD, ShardingSpec

    return ShardingSpec(args.shard or DEFAULT_SHARD, bool(args.reshard_after_forward))


def model_and_hardware(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--model`` and ``--hardware`` as given, each one unset taken from the workload
    preset ``--dataset`` names (``stdlib``: ``stdlib-code``'s), as ``plan``, ``schedule``
    and ``simulate`` read them."""
    from datacentric.data.workloads import get_workload, list_workloads

    model, hardware = args.model, args.hardware
    name = "stdlib-code" if args.dataset == "stdlib" else args.dataset
    if name in list_workloads() and not (model and hardware):  # the preset's defaults
        preset = get_workload(name, seed=args.seed, num_samples=100)
        model, hardware = model or preset.model, hardware or preset.hardware
    return model, hardware


def analytic_model(model: str, hardware: str, world: int, args: argparse.Namespace) -> Any:
    """The analytic cost model of ``--model`` (any model string, with its ``--model-arg``
    keyword arguments) on ``--hardware`` (fp32 on ``cpu-local``, bf16 elsewhere) with
    ``--shard``; the budget is :func:`memory_budget`'s."""
    from datacentric.models.model_args import parse_model_args
    from datacentric.profiling.factory import analytic_cost_model, named_spec

    spec = named_spec(
        model, parse_model_args(getattr(args, "model_args", None)), lora_of_args(args)
    )
    return analytic_cost_model(spec, hardware, shard=sharding_of(args), world_size=world)


def profiled_model(args: argparse.Namespace) -> tuple[Any, int]:
    """The cost model fitted to ``--profile DIR`` and the world it was measured on
    (the budget is :func:`memory_budget`'s)."""
    from datacentric.profiling.factory import fitted_cost_model
    from datacentric.profiling.store import ProfileError, load_profile

    profile = load_profile(args.profile)
    if profile is None:
        raise ProfileError(f"{args.profile}: no profile.json")
    return fitted_cost_model(profile), int(profile.fingerprint["world_size"])


def memory_budget(args: argparse.Namespace, cost: Any) -> int:
    """The budget per rank of a command, resolved once: ``--memory-gb``, else the cap of
    the plan saved in ``--profile DIR``, else ``--memory-fraction`` of the memory of the
    analytic model's hardware."""
    from datacentric.planning.memory_cap import device_memory_of, resolve_memory_cap
    from datacentric.profiling.store import PLAN_FILE, ProfileError, load_plan

    if args.memory_gb is None and getattr(args, "profile", None):
        saved = Path(args.profile) / PLAN_FILE
        if not saved.exists():  # a training run's profile folder keeps no plan
            raise ProfileError(
                f"{saved}: no saved plan to take the memory budget per rank from (a "
                "training run's profile keeps none): give --memory-gb GIB, or run "
                "`datacentric profile`"
            )
        return load_plan(args.profile).memory_cap_bytes
    return resolve_memory_cap(args.memory_gb, device_memory_of(cost), args.memory_fraction)


def command_pipeline(
    args: argparse.Namespace, shapes: list[SampleShape], cost: Any, world: int, **settings: Any
) -> Any:
    """The :class:`~datacentric.scheduling.pipeline.Pipeline` of a command's flags: the
    budget of :func:`memory_budget` and ``--skip-unfittable`` when the command has it;
    ``settings``: the rest (``options``, ``seed``, ``policy``)."""
    from datacentric.scheduling.pipeline import Pipeline

    return Pipeline(
        shapes,
        cost,
        world_size=world,
        memory_cap_bytes=memory_budget(args, cost),
        skip_unfittable=bool(getattr(args, "skip_unfittable", False)),
        **settings,
    )


def global_batch_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``[scheduling]`` keys of
    :func:`~datacentric.cli.flag_groups.add_global_batch_flags`, checked."""
    for name in ("global_batch_tokens", "global_batch_samples", "reorder_window"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= 1, got {value}")
    return {
        "global_batch_tokens": args.global_batch_tokens,
        "global_batch_samples": args.global_batch_samples,
        "reorder_window": args.reorder_window,
    }


def sized_global_batch(
    args: argparse.Namespace, options: Any, shapes: list[SampleShape], cost: Any, world: int
) -> Any:
    """The ``[scheduling]`` section ``options`` with the global batch ``train`` would size
    for ``shapes`` on ``world`` ranks when none is given
    (:func:`~datacentric.scheduling.global_batches.size_global_batch`: a small dataset's
    from its samples, never below what covers the ranks with groups of the largest SP
    size the cost model's heads allow, as ``train`` covers them with the model's), so
    that ``schedule`` and ``simulate`` count the steps ``train`` runs; its note is said
    on stderr."""
    from datacentric.cli.ranks import say
    from datacentric.planning.bucket_options import mixable_sp_sizes
    from datacentric.planning.cost_model import supports_split
    from datacentric.scheduling.global_batches import size_global_batch

    ulysses = [s for s in mixable_sp_sizes(world) if supports_split(cost, s, 1)]
    tokens = [shape.tokens for shape in shapes]
    batch = size_global_batch(options, tokens, world_size=world, largest_sp=max(ulysses, default=1))
    if batch.note:
        say(args.command, f"note: {batch.note}")
    return batch.applied(options)
