"""Build a run's dataset, model and cost model, each from the sections it reads.

Every function here takes the sections it reads (``settings.data``, ``settings.model``,
``settings.lora``...), never the whole settings object (internal functions: no
deprecated form is kept, see docs/api.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.data.base import Dataset
from datacentric.data.sources import open_dataset
from datacentric.data.text import SyntheticTextDataset
from datacentric.log import quiet_loading
from datacentric.models.configs import model_config
from datacentric.models.lora import apply_lora
from datacentric.models.model_args import lora_of
from datacentric.models.presets import MODEL_PRESETS
from datacentric.models.source import (
    ModelSource,
    build_from_source,
    build_model_named,
    check_data_kind,
    parse_model_args,
    resolve_model,
)
from datacentric.parallel.grad_sync import check_fsdp2
from datacentric.parallel.groups import device_memory_bytes as device_memory_bytes  # its old home
from datacentric.parallel.launch import launch_mode
from datacentric.planning.analytic import analytic_model
from datacentric.planning.cost_model import CostModel
from datacentric.planning.hardware import get_hardware
from datacentric.planning.model_specs import ModelSpec
from datacentric.planning.sharding import ShardingSpec
from datacentric.planning.spec_derivation import (
    UnpricedModelError,
    identity_of_model,
    spec_from_model_config,
    spec_of_model,
)
from datacentric.profiling.autoprofile import ensure_profile
from datacentric.profiling.factory import fitted_cost_model, named_spec
from datacentric.profiling.profiler import ProfileSettings
from datacentric.profiling.store import model_identity
from datacentric.settings.sections import (
    CostConfig,
    DataConfig,
    JobConfig,
    LoraConfig,
    ModelConfig,
    ParallelismConfig,
)
from datacentric.shapes import SampleShape
from datacentric.verify.model_contract import check_small_copy, check_text_rows


def sharding(parallelism: ParallelismConfig) -> ShardingSpec:
    """The ``[parallelism]`` section's shard setting as a spec (raises ``ValueError`` for a
    bad one)."""
    return ShardingSpec(parallelism.shard, parallelism.reshard_after_forward)


def build_dataset(data: DataConfig, seed: int = 0) -> Dataset:
    """The run's dataset from its ``[data]`` section and ``[job] seed`` (see
    :func:`datacentric.data.sources.open_dataset`)."""
    return open_dataset(data.dataset, data, seed=seed)


def model_source(model: ModelConfig, lora: LoraConfig | None = None) -> ModelSource:
    """The ``[model]`` section's model as a :class:`~datacentric.models.source.ModelSource`,
    with the LoRA adapters of the ``[lora]`` section (``None``: LoRA off)."""
    source = resolve_model(model.model, model.model_args)
    return dataclasses.replace(source, lora=lora_of(lora or LoraConfig()))


def build_model_for(
    model: ModelConfig, dataset: Dataset, *, lora: LoraConfig | None = None
) -> nn.Module:
    """The ``[model]`` section's model (:mod:`datacentric.models.source`: a preset,
    ``hf:DIR_OR_NAME``, ``diffusers:DIR_OR_NAME`` or ``pkg.module:factory``) with the
    ``[lora]`` section's adapters, its parameters in float32 (``bfloat16`` is autocast).
    Seed the global RNG first: every rank must build identical weights (a pretrained
    folder's are read from the folder)."""
    source = model_source(model, lora)
    with loading_quietly(source):  # the loaders' bars, when a run starts from Python too
        module, _ = build_from_source(source, dtype=torch.float32, dataset=dataset)
    return module


def loading_quietly(source: ModelSource) -> AbstractContextManager:
    """:func:`~datacentric.log.quiet_loading` around the build of ``source``, except for
    a preset, which loads nothing through transformers or diffusers (importing them only
    to silence their bars took over a second of a rank's start-up)."""
    return nullcontext() if source.kind == "preset" else quiet_loading()


@dataclass(frozen=True)
class RunPlace:
    """Where a run's model trains and on what, as its cost model reads them: built once
    by the run's assembly from its process groups, the ``[parallelism]`` and ``[job]``
    sections and its samples, and carried by the :class:`RunModel`."""

    device: torch.device = torch.device("cpu")
    """The device each rank trains on."""
    world_size: int = 1
    """The ranks of the run."""
    shard: ShardingSpec = field(default_factory=lambda: sharding(ParallelismConfig()))
    """How model state is held (the ``[parallelism]`` section's, :func:`sharding`)."""
    job: JobConfig = field(default_factory=JobConfig)
    """The ``[job]`` section: the default profile folder (``<out>/profile``), the seed."""
    progress: bool = True
    """This rank shows the profiler's progress."""
    shapes: Sequence[SampleShape] = ()
    """The run's sample shapes (a profile measures and fits on them)."""
    dataset: Dataset | None = None
    """The run's samples, when opened (a profile measures a user's model on its own)."""
    sp_sizes: Sequence[int] | None = None
    """The SP sizes the run may use (a profile measures these; None: its default)."""
    ranks_per_node: int | None = None
    """The run's ranks on each node (its process groups' ``ranks_per_node``: torchrun's
    ``LOCAL_WORLD_SIZE``, else the world); the analytic model prices larger groups across
    nodes. None: the hardware preset's node."""


@dataclass(frozen=True)
class RunModel:
    """A run's model and its description, resolved once: the ``--model`` source (its
    checked arguments and the ``[lora]`` section's adapters), the dtype it trains in,
    the built module (None where the caller builds none, as a measured comparison's
    launcher), the spec read off it before its adapters are injected and the analytic
    model the step records' ``mfu`` counts on. The cost model (:func:`run_cost_model`),
    the profiler and ``mfu`` read the model from here, never from the settings again."""

    source: ModelSource
    """The resolved ``--model`` string, its arguments and its adapters."""
    dtype: str
    """``[model] dtype``: ``float32`` or ``bfloat16`` (autocast)."""
    module: nn.Module | None = None
    """The built model (its adapters injected), if built."""
    mfu: CostModel | None = None
    """The analytic model ``mfu`` counts FLOPs on (:func:`mfu_cost_model`)."""
    bare_spec: ModelSpec | None = None
    """The spec of the model without its adapters (blocks, heads, widths), read once
    off the built model (:func:`build_run_model`); None where no model was built or its
    cost cannot be read."""
    trained_spec: ModelSpec | None = None
    """The spec the run prices: :attr:`bare_spec`, or with LoRA the spec read off the
    built model once its adapters are injected (what trains); None where no model was
    built or its cost cannot be read."""
    built_identity: Mapping[str, Any] | None = None
    """What a measured profile's fingerprint records of the model (class, config,
    parameter shapes), read once off the built model before its adapters are injected
    (:func:`~datacentric.planning.spec_derivation.identity_of_model`); None for a
    preset (its config is recorded) or where no model was built."""
    place: RunPlace = field(default_factory=RunPlace)
    """Where it trains and on what (:meth:`placed`; default: one CPU rank)."""
    meta_built: dict[str, nn.Module] = field(default_factory=dict, repr=False, compare=False)
    """A model not built here, built once on the meta device by its name when its
    :attr:`identity` or :attr:`profile_spec` is first read (:meth:`meta_module`); shared
    by the copies :meth:`placed` makes, so a comparison that places it again builds it
    no more."""

    @classmethod
    def of(cls, model: ModelConfig, lora: LoraConfig | None = None) -> RunModel:
        """The ``[model]`` and ``[lora]`` sections' model, not built."""
        return cls(model_source(model, lora), model.dtype)

    def placed(self, place: RunPlace) -> RunModel:
        """This model, trained where and on what ``place`` says."""
        return dataclasses.replace(self, place=place)

    @cached_property
    def spec(self) -> ModelSpec:
        """The spec the run prices: :attr:`trained_spec`, read when the model was built;
        for a model not built here (or whose cost cannot be read, which then raises),
        found by its name (:func:`~datacentric.profiling.factory.named_spec`: the
        analytic preset, else the model built on the meta device)."""
        if self.trained_spec is not None:
            return self.trained_spec
        source = self.source
        return named_spec(source.name, source.args, source.lora, module=self.module)

    @cached_property
    def profile_spec(self) -> ModelSpec:
        """The spec a measured profile records (the model without its adapters: its
        blocks and their attention): :attr:`bare_spec`, read when the model was built;
        for a model not built here (or whose cost cannot be read, which then raises),
        found by its name (:func:`~datacentric.profiling.factory.named_spec`: an analytic
        preset's own spec, else read off :meth:`meta_module`)."""
        if self.bare_spec is not None:
            return self.bare_spec
        source = self.source
        if source.kind == "preset" and not source.args:  # its spec by name, nothing built
            return named_spec(source.name)
        return named_spec(source.name, source.args, module=self.meta_module())

    @cached_property
    def identity(self) -> Mapping[str, Any] | None:
        """What a measured profile's fingerprint records of the model:
        :attr:`built_identity`, read when the model was built; for a model not built
        here, :func:`~datacentric.profiling.store.model_identity` read off
        :meth:`meta_module` (``None`` for a preset, whose config is recorded: nothing is
        built)."""
        if self.built_identity is not None or self.module is not None:
            return self.built_identity
        if self.source.kind == "preset":
            return None
        return model_identity(self.source.name, self.source.args, module=self.meta_module())

    def meta_module(self) -> nn.Module:
        """The model without its adapters built on the meta device by its name (no
        memory, no weights read), once (:attr:`meta_built`)."""
        if "module" not in self.meta_built:
            source = self.source
            args = dict(source.args or {})
            self.meta_built["module"] = build_model_named(source.name, args, device="meta")
        return self.meta_built["module"]


def build_run_model(
    model: ModelConfig, dataset: Dataset, device: torch.device, *, lora: LoraConfig | None = None
) -> RunModel:
    """The run's model, built once: :func:`build_model_for`'s model, its specs read off it
    before the ``[lora]`` section's adapters are injected and after (what trains)
    (:func:`~datacentric.planning.spec_derivation.spec_of_model`; a preset without model
    arguments: its config's spec, as its name is priced everywhere; ``None`` for a model
    whose cost cannot be read) and the analytic model the step records' ``mfu``
    counts FLOPs on from that spec (:func:`mfu_cost_model`), so nothing needs a second
    build. The same weights as :func:`build_model_for` (the adapters are drawn last
    either way)."""
    source = model_source(model, lora)
    bare = dataclasses.replace(source, lora=None)
    with loading_quietly(bare):  # the loaders' bars, when a run starts from Python too
        module, _ = build_from_source(bare, dtype=torch.float32, dataset=dataset)
    try:  # read off the module, but a preset unchanged is priced as its name is
        if bare.kind == "preset" and not bare.args:
            spec = spec_from_model_config(model_config(bare.target), bare.name)
        else:
            spec = spec_of_model(module, bare.name)
    except UnpricedModelError:
        spec = None
    # what a profile's fingerprint records of it, read off it in the same pass
    identity = None if bare.kind == "preset" else identity_of_model(module, bare.args)
    trained = spec
    if source.lora is not None:
        apply_lora(module, source.lora)
        try:  # what trains: the adapters
            trained = None if spec is None else spec_of_model(module, bare.name)
        except UnpricedModelError:
            trained = None
    mfu = mfu_cost_model(spec, model.dtype, device)
    return RunModel(source, model.dtype, module, mfu, spec, trained, identity)


def what_trains(module: nn.Module, tokenizer: str | None = None) -> str:
    """One line naming what a run trains: ``trains all 1,234 parameters (full)`` or
    ``trains LoRA rank 4 on q_proj,v_proj: 2,048 of 1,236,992 parameters (0.17%)``, then
    the tokenizer its text is read with (``tokenizer``: None, the run reads no text)."""
    total = sum(p.numel() for p in module.parameters())
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    share = f"{trained:,} of {total:,} parameters ({100 * trained / max(total, 1):.3g}%)"
    spec = getattr(module, "lora_spec", None)
    if spec is not None:
        targets = spec.targets or ()
        on = ",".join(targets) if len(targets) <= 8 else f"{len(targets)} modules"
        line = f"trains LoRA rank {spec.rank} on {on}: {share}"
    elif trained == total:
        line = f"trains all {total:,} parameters (full)"
    else:
        line = f"trains {share}"
    return line if tokenizer is None else f"{line}; reads text with tokenizer {tokenizer}"


def build_cost_model(
    model: str | ModelSpec,
    device: torch.device,
    dtype: str = "float32",
    *,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
) -> CostModel:
    """The cost model a schedule is planned with, for model ``model`` (a name:
    :func:`~datacentric.profiling.factory.named_spec`) or a spec: :func:`device_cost_model`."""
    spec = named_spec(model) if isinstance(model, str) else model
    return device_cost_model(spec, device, dtype, shard=shard, world_size=world_size)


#: The dtypes a run trains in (``[model] dtype``, ``DataCentric(dtype=)``).
RUN_DTYPES = ("float32", "bfloat16")


def device_cost_model(
    spec: ModelSpec,
    device: torch.device,
    dtype: str = "float32",
    *,
    shard: ShardingSpec | str | None = None,
    world_size: int = 1,
    ranks_per_node: int | None = None,
) -> CostModel:
    """The analytic FLOP/byte model of ``spec`` on this device: ``cpu-local``
    (calibrated on a CPU) or ``h100-sxm``/``h200-sxm`` by the CUDA device's name; model
    state is held as ``shard`` says on ``world_size`` ranks, ``ranks_per_node`` of them
    on each node (None: the preset's node; groups larger than a node cross nodes). The
    model only prices memory: the budget is the plan's. ``dtype``: one of
    :data:`RUN_DTYPES` (another is a ``ValueError`` naming them)."""
    if dtype not in RUN_DTYPES:
        raise ValueError(
            f"dtype {dtype!r}: a run trains in float32 or bfloat16 (float32 weights, "
            "gradients and optimizer state, each forward under bfloat16 autocast)"
        )
    return analytic_model(
        spec,
        get_hardware(_hardware_name(device)),
        dtype_bytes=2 if dtype == "bfloat16" else 4,
        shard=shard,
        world_size=world_size,
        ranks_per_node=ranks_per_node,
    )


def run_cost_model(model: RunModel, cost: CostConfig, *, resumed: bool = False) -> CostModel:
    """The cost model of a training run of ``model`` (collective when it profiles), from
    the ``[cost]`` section, on the ranks and device its :attr:`~RunModel.place` says,
    holding model state as it says.

    ``profile``: the dual-layer profile in ``profile_dir`` (default ``<out>/profile`` of
    the place's ``[job]`` section) if its fingerprint matches this model, device, torch,
    world and dtype, else one measured now on the run's own ranks (no second launch) on
    the run's own samples and SP sizes, and saved there; the fitted model then predicts
    every bucket; ``resumed`` (a resumed run), the saved profile as it is, unprobed: the
    schedule its checkpoint's steps ran is rebuilt from it. ``analytic``:
    :func:`device_cost_model` of the run's spec (:attr:`RunModel.spec`).
    """
    place = model.place
    if cost.cost_model == "analytic":
        return device_cost_model(
            model.spec,
            place.device,
            model.dtype,
            shard=place.shard,
            world_size=place.world_size,
            ranks_per_node=place.ranks_per_node,
        )
    source = model.source
    directory = cost.profile_dir or str(Path(place.job.out) / "profile")
    settings = ProfileSettings(
        model=source.name,
        model_args=source.args,
        lora=source.lora,
        dataset=None if source.name in MODEL_PRESETS else place.dataset,
        world_size=place.world_size,
        backend="nccl" if place.device.type == "cuda" else "gloo",
        dtype=model.dtype,
        seed=place.job.seed,
        progress=place.progress,
        # Wall time: the schedule (and the simulator checked against this run) predict
        # wall-clock steps, collective waits included.
        clock="wall",
        cost=cost,
        spec=model.profile_spec,
        source=source,
        identity=model.identity,
        ranks_per_node=place.ranks_per_node,
    )
    # resumed: the saved profile as it is (a fresh measurement would rebuild another
    # schedule than the one the checkpoint's steps ran, and the resume would refuse it)
    profile = ensure_profile(
        directory, settings, place.shapes, sp_sizes=place.sp_sizes, probe=not resumed
    )
    return fitted_cost_model(profile)


def mfu_cost_model(spec: ModelSpec | None, dtype: str, device: torch.device) -> CostModel | None:
    """The analytic model the step records' ``mfu`` counts FLOPs on: ``spec`` (the
    model without its adapters, :attr:`RunModel.bare_spec`) trained in ``dtype`` on this
    device; ``None`` for a model whose cost cannot be read (``spec`` None)."""
    return None if spec is None else device_cost_model(spec, device, dtype)


def model_args(model: ModelConfig) -> dict:
    """The ``[model]`` section's ``model_args``, parsed and checked."""
    return parse_model_args(model.model_args)


def _hardware_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-local"
    name = torch.cuda.get_device_name(device).lower()
    return "h200-sxm" if "h200" in name else "h100-sxm"


def check_model(
    model: ModelConfig,
    dataset: Dataset,
    *,
    lora: LoraConfig | None = None,
    parallelism: ParallelismConfig | None = None,
    cost: CostConfig | None = None,
) -> nn.Module:
    """Everything about the run's model that can be checked before ranks start, on the
    meta device (no weights read): the ``--model`` string and ``--model-arg`` keys, the
    model contract's attributes, features the packed path refuses (raised by the
    adapters at construction), data of the kind the model trains on
    (:func:`~datacentric.models.source.check_data_kind`), the vocabulary against the
    dataset's, and, for the analytic cost model, that its cost can be read from it. A
    Hugging Face model then runs the model contract's forward passes on a small CPU copy
    keeping every layer type (features that show only when the model runs). Raises a
    ``ValueError`` naming the model and what is wrong. Reads the ``[model]``, ``[lora]``,
    ``[parallelism]`` and ``[cost]`` sections. Returns the model built on the meta device
    (the other checks before ranks start read it: one build)."""
    name = model.model
    source = model_source(model, lora)
    try:
        with loading_quietly(source):
            module, _ = build_from_source(source, device="meta", dataset=dataset)
    except (
        AssertionError,
        AttributeError,
        IndexError,
        TypeError,
        KeyError,
        RuntimeError,
        NotImplementedError,
    ) as err:
        # a preset follows the data, and fails on the other kind's: that is the cause
        check_data_kind(source, dataset)
        # raised inside the model's own constructor: name the model and the cause
        raise ValueError(f"model {name!r} cannot be built: {err}") from err
    check_data_kind(source, dataset)  # after the model's own refusals (its class, config)
    missing = [
        a for a in ("blocks", "set_attention", "num_heads", "loss_mode") if not hasattr(module, a)
    ]
    if missing:
        raise ValueError(
            f"model {name!r} lacks {', '.join(missing)}; a datacentric model needs "
            "blocks, set_attention(fn), num_heads, loss_mode and forward(batch) -> per-token "
            "loss (docs/models.md)"
        )
    held = sharding(parallelism or ParallelismConfig())
    if held.mode == "fsdp2":  # e.g. reshard_after_forward on per-shape block calls
        check_fsdp2(module, held.reshard_after_forward)
    analytic = (cost or CostConfig()).cost_model == "analytic"
    spec = spec_of_model(module, name) if analytic else None
    _check_vocab(name, module, spec, dataset, folder=source.folder)
    try:  # a Hugging Face model runs forward on a small CPU copy (before ranks start)
        calls = check_small_copy(module, dataset)
        check_text_rows(module, dataset)
    except ValueError as err:
        raise ValueError(f"model {name!r}: {err}") from err
    world = launch_mode((parallelism or ParallelismConfig()).world).world_size
    reused = [(i, n) for i, n in enumerate(calls) if n != 1]
    if reused and held.effective(world).mode == "fsdp2":
        raise BlockReuseError(name, *reused[0], module)
    return module


class BlockReuseError(ValueError):
    """A model whose forward calls a block more than once, held with FSDP2 on several
    ranks (which gathers a block once per call); the check before ranks start holds it
    with DDP instead. ``module``: the model the check built, on the meta device."""

    def __init__(self, name: str, index: int, count: int, module: nn.Module) -> None:
        self.index, self.count, self.module = index, count, module
        super().__init__(
            f"model {name!r}: its forward calls block {index} {count} times (a block "
            "reused, as a recurrent-depth model loops over its layers); FSDP2 (shard "
            "fsdp2, the default) gathers a block once per call, so its ranks would issue "
            "different collectives: pass --shard ddp"
        )


def _check_vocab(
    name: str,
    module: nn.Module,
    spec: ModelSpec | None,
    dataset: Dataset,
    folder: Path | None = None,
) -> None:
    """The model's token ids (its config's, else the spec's) cover the dataset's;
    ``folder``: the model's folder (``hf:DIR``), whose own tokenizer may be the one read."""
    vocab = getattr(getattr(module, "config", None), "vocab_size", None)
    if vocab is None and spec is not None:
        vocab = spec.vocab_size or None
    data_vocab = getattr(dataset, "vocab_size", None)
    if vocab and data_vocab and int(data_vocab) > int(vocab):
        if isinstance(dataset, SyntheticTextDataset):  # no tokenizer: random ids
            raise ValueError(
                f"model {name!r} has {vocab} token ids but the synthetic workload draws "
                f"ids below {data_vocab}: train on text files with the model's tokenizer "
                "(--dataset jsonl:FILE --tokenizer DIR/tokenizer.json)"
            )
        if _in_folder(getattr(dataset, "tokenizer", None), folder):  # the folder's own
            raise ValueError(
                f"model {name!r}: the folder's own tokenizer has {data_vocab} ids (added "
                f"tokens included) but its config.json says vocab_size {vocab}: resize the "
                "model's embeddings to its tokenizer (model.resize_token_embeddings("
                "len(tokenizer)), then model.save_pretrained(DIR)), or correct vocab_size "
                f"in config.json if its embedding holds {data_vocab} rows"
            )
        raise ValueError(
            f"model {name!r} has {vocab} token ids but the dataset's tokenizer has "
            f"{data_vocab}: use the model's own tokenizer (--tokenizer DIR/tokenizer.json)"
        )


def _in_folder(tokenizer: str | None, folder: Path | None) -> bool:
    """Whether the tokenizer read (a folder or its ``tokenizer.json``) is ``folder``'s."""
    if not tokenizer or folder is None:
        return False
    path, folder = Path(tokenizer).expanduser().resolve(), folder.expanduser().resolve()
    return path == folder or path.parent == folder
