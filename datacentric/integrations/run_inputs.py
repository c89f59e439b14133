"""What a drop-in trainer writes for its run under ``<output_dir>/run/inputs``, and the
run's settings read from it.

Rank 0 writes the model (``save_pretrained``; a folder is used as it is), the tokenizer
and the datasets as pre-tokenized records (every rank waits). The settings are the
arguments' (:mod:`.arguments`) with the ``[data]``/``[model]``/``[validation]`` sections
naming those inputs and the ``[lora]`` section of ``peft_config``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.integrations.arguments import ArgumentsError, training_settings
from datacentric.integrations.outputs import run_folder, save_base
from datacentric.integrations.records import write_records
from datacentric.integrations.stops import stop
from datacentric.settings import SECTIONS, ConfigError
from datacentric.settings.run_settings import build_sections

INPUTS = "inputs"

#: a drop-in's ``records``: a dataset and the tokenizer to ``{"input_ids", "labels"}`` rows
Records = Callable[[Any, Any], list[dict[str, list[int]]]]


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What a drop-in wrote under ``run/inputs`` for its run."""

    folder: Path
    model_dir: Path
    """The model's folder (the one given, or ``inputs/model``): the run's base."""
    tokenizer: Any
    """The tokenizer (``processing_class``, else the model folder's)."""
    train_tokens: tuple[int, ...]
    """Tokens of each training record."""
    eval_files: dict[str, Path]
    """Each held-out set's records file, by metric prefix (``eval``, ``eval_<name>``)."""
    eval_samples: dict[str, int]
    longest: int
    """Tokens of the longest record (``data.max_tokens``)."""


def write_inputs(
    command: str,
    output_dir: str,
    model: Any,
    processing_class: Any,
    datasets: tuple[Any, Any],
    records: Records,
    main: bool,
) -> RunInputs:
    """The model, tokenizer and datasets (``(train_dataset, eval_dataset)``) as the run
    reads them, written under ``run/inputs`` by rank 0 (every rank waits)."""
    inputs = run_folder(output_dir) / INPUTS
    model_dir, tokenizer = _write_model(command, inputs, model, processing_class, main)
    train_dataset, sets = datasets
    train = records(train_dataset, tokenizer)
    if not train:
        stop(command, "train_dataset: no record has a token with loss")
    if not isinstance(sets, dict):
        sets = {} if sets is None else {None: sets}
    held, files = {}, {}
    for index, (name, dataset) in enumerate(sets.items()):
        prefix = "eval" if name is None else f"eval_{name}"
        held[prefix] = records(dataset, tokenizer)
        if not held[prefix]:
            stop(command, f"eval_dataset {name or ''}: no record has a token with loss")
        files[prefix] = inputs / f"eval{'' if name is None else f'-{index}'}.jsonl"
    if main:
        write_records(train, inputs / "train.jsonl")
        for prefix, rows in held.items():
            write_records(rows, files[prefix])
    tokens, held_tokens = _rank_0_lengths(train, held)
    samples = {prefix: len(counts) for prefix, counts in held_tokens.items()}
    longest = max(tokens + tuple(n for counts in held_tokens.values() for n in counts))
    return RunInputs(inputs, model_dir, tokenizer, tokens, files, samples, longest)


def streamed_rows(command: str, args: Any, dataset: Any, world: int) -> Any:
    """The training set as the run reads it: a ``datasets.Dataset`` (anything with a
    length) as it is; a stream (an ``IterableDataset``, no length) as transformers'
    ``Trainer`` reads it, its first ``max_steps`` x the global batch rows (all of them,
    read again from the start, when it ends first), which the run then trains as its
    set. The script stops where transformers raises (no ``max_steps``), and with TRL's
    ``packing=True`` (its packed rows of a stream are not counted in rows)."""
    if hasattr(dataset, "__len__"):
        return dataset
    if args.max_steps <= 0:
        stop(
            command,
            "train_dataset is an IterableDataset (a stream, no length): set max_steps, "
            "as transformers requires (it reads max_steps x the global batch rows of it)",
        )
    if getattr(args, "packing", False):
        stop(
            command,
            "packing=True with an IterableDataset train_dataset: give a datasets.Dataset "
            "(Dataset.from_generator, or the stream's .take(N) rows), or packing=False",
        )
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    return list(itertools.islice(dataset, batch * args.max_steps))


def _rank_0_lengths(
    train: list[dict[str, list[int]]], held: dict[str, list[dict[str, list[int]]]]
) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]]]:
    """The tokens of each training record and of each held-out set's, as rank 0 has
    them: the records the run reads are the ones rank 0 wrote, and every rank plans from
    them (a ``formatting_func`` may draw at random: a rank's own records would plan other
    lengths than the run reads, and the ranks fall out of step). Collective: every rank
    waits for rank 0's files."""
    lengths = (
        tuple(len(r["input_ids"]) for r in train),
        {prefix: tuple(len(r["input_ids"]) for r in rows) for prefix, rows in held.items()},
    )
    if not dist.is_initialized():
        return lengths
    box = [lengths]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run_settings(
    command: str,
    args: Any,
    inputs: RunInputs,
    world: int,
    resume: tuple[bool, str | None],
    lora: dict[str, Any],
) -> Any:
    """The run's settings: the arguments' (:mod:`.arguments`), the inputs, the
    ``resume`` (``(resume, resume_from)``) and the ``[lora]`` section."""
    try:
        sections = training_settings(args, world=world, tokens=inputs.train_tokens)
    except ArgumentsError as err:
        stop(command, str(err))
    resume, resume_from = resume
    sections["job"].update(out=str(inputs.folder.parent), overwrite=False)
    sections["model"]["model"] = f"hf:{inputs.model_dir}"
    sections["data"] = {
        "dataset": f"jsonl:{inputs.folder / 'train.jsonl'}",
        "tokenizer": str(inputs.folder / "tokenizer"),
        "max_tokens": inputs.longest,
        "long_docs": "error",
    }
    first = next(iter(inputs.eval_files.values()), None)
    sections["validation"]["dataset"] = f"jsonl:{first}" if first else None
    if first is None:
        sections["validation"]["every"] = None
    sections["cost"] = {"cost_model": "analytic"}
    sections["metrics"]["plots"] = False
    sections["checkpoint"].update(resume=resume, resume_from=resume_from)
    if any(
        f.name == "checkpoint_every_minutes" for f in dataclasses.fields(SECTIONS["checkpoint"])
    ):
        sections["checkpoint"]["checkpoint_every_minutes"] = 0.0  # by steps, as transformers
    sections["lora"] = lora
    try:
        return build_sections(sections)
    except ConfigError as err:
        stop(command, str(err))


def lora_section(command: str, peft: Any, model: Any) -> dict[str, Any]:
    """The ``[lora]`` section of ``peft`` (``peft_config``: a peft ``LoraConfig``; None:
    no section) for ``model``; any other of its fields set away from the default is
    refused by name."""
    if peft is None:
        return {}
    from peft import LoraConfig

    if not isinstance(peft, LoraConfig):
        stop(command, "peft_config: only a LoraConfig is supported")
    mapped = {"r", "lora_alpha", "lora_dropout", "target_modules", "task_type"}
    reference = LoraConfig()
    refused = [
        f"{f.name}={getattr(peft, f.name)!r}"
        for f in dataclasses.fields(peft)
        if f.init
        and f.name not in mapped
        # fan_in_fan_out: peft sets it by each adapted layer's type whatever is given
        # (transformers' Conv1D: true), as datacentric's LoRA does
        and f.name not in {"peft_type", "revision", "fan_in_fan_out"}
        and getattr(peft, f.name) != getattr(reference, f.name)
    ]
    if refused:
        stop(
            command,
            f"peft_config {', '.join(refused)}: not supported (rank, "
            "alpha, dropout and target_modules map); leave it at the default",
        )
    targets = peft.target_modules
    if targets is None:
        targets = _peft_default_targets(model)
    if not isinstance(targets, str):
        targets = ",".join(sorted(targets))
    return {
        "rank": peft.r,
        "alpha": float(peft.lora_alpha),
        "dropout": float(peft.lora_dropout),
        "targets": targets,
    }


def _write_model(
    command: str, inputs: Path, model: Any, tokenizer: Any, main: bool
) -> tuple[Path, Any]:
    """The model's folder (written by rank 0 for a model object) and the tokenizer
    (``tokenizer``, else the model folder's; written beside it)."""
    from transformers import AutoTokenizer

    folder = _model_folder(command, model) or inputs / "model"
    if main and not isinstance(model, (str, Path)):
        save_base(model, folder)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(command, model))
    if main:
        tokenizer.save_pretrained(inputs / "tokenizer")
    if dist.is_initialized():
        dist.barrier()
    return folder.resolve(), tokenizer


def _model_folder(command: str, model: Any) -> Path | None:
    """The folder ``model`` names (None: a model object); the script stops when it names
    no folder (nothing is downloaded)."""
    if not isinstance(model, str | os.PathLike):
        return None
    if not Path(model).is_dir():
        stop(
            command,
            f"model={model!r}: no such folder (nothing is downloaded: "
            "give a local folder saved with save_pretrained, or a model object)",
        )
    return Path(model)


def tokenizer_source(command: str, model: Any) -> Path:
    """The folder ``processing_class`` is loaded from when unset, as TRL loads it: the
    model's folder, or the local folder a model object was loaded from; the script
    stops when a model object names none that holds a tokenizer."""
    folder = _model_folder(command, model)  # a folder name: that folder (else it stops)
    source = folder if folder is not None else _tokenizer_folder(model)
    if source is None:
        stop(
            command,
            "give processing_class (the tokenizer): the model object was not loaded "
            "from a local folder that holds one",
        )
    return source


def _tokenizer_folder(model: Any) -> Path | None:
    """The local folder a model object was loaded from, when it holds a tokenizer."""
    folder = Path(getattr(model, "name_or_path", "") or "")
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    found = str(folder) not in ("", ".") and any((folder / name).is_file() for name in names)
    return folder if found else None


def _peft_default_targets(model: Any) -> str:
    """peft's default LoRA targets of the model's type (what ``get_peft_model`` adapts
    when ``target_modules`` is unset), comma-separated."""
    from transformers import AutoConfig

    from datacentric.models.lora import peft_default_targets

    config = getattr(model, "config", None) or AutoConfig.from_pretrained(
        _model_folder("SFTTrainer", model)
    )
    targets = peft_default_targets(config.model_type)
    if targets is None:
        stop(
            "SFTTrainer",
            f"peft_config: set target_modules (peft has no default for {config.model_type!r})",
        )
    return ",".join(targets)
