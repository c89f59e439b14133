"""One function from a ``--dataset`` string to a :class:`~datacentric.data.base.Dataset`.

- ``stdlib``: the embedded standard-library corpus;
- a workload preset name (``opensora-short``, ``sft-longtail``, ...): its shapes as
  synthetic data (video latents for video presets, random bytes for text);
- ``jsonl:PATH_OR_GLOB``, ``parquet:PATH_OR_GLOB``, ``text:PATH_OR_GLOB``,
  ``hf-datasets:DIR``: tokenized documents (:mod:`datacentric.data.tokenized`);
- ``latents:DIR`` (or a manifest file): video latents (:mod:`datacentric.data.latents`);
- ``package.module:factory``: ``factory(**settings)`` returns a dataset; it receives
  those of the ``[data]`` section's fields (:class:`~datacentric.settings.sections.
  DataConfig`) and ``seed`` that it names as parameters (all of them if it takes
  ``**kwargs``).

A run's data is opened here too, in one place: the tokenizer its text is read with
(:func:`with_model_tokenizer`: the one given, else an ``hf:DIR`` model's own), and its
training and held-out sets (:func:`build_run_data`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from pathlib import Path
from typing import Any

from datacentric.data.base import DataError, Dataset, SampleSubset
from datacentric.data.diffusion_draws import DiffusionDraws
from datacentric.data.holdout import split_ids
from datacentric.data.stdlib import StdlibCorpus
from datacentric.data.text import SyntheticTextDataset
from datacentric.data.tokenized import LONG_DOC_RULES, TEXT_KINDS, TokenizedTextDataset
from datacentric.data.tokenizer_files import BYTES
from datacentric.data.video import SyntheticVideoDataset
from datacentric.data.workloads import list_workloads, preset_shapes
from datacentric.progress import counted
from datacentric.settings.sections import (
    DataConfig,
    ModelConfig,
    ValidationConfig,
    split_fraction,
)


class DataSettings:
    """Deprecated (removed in 0.3.0): the ``[data]`` section is one type,
    :class:`~datacentric.settings.sections.DataConfig` (``datacentric.data.DataConfig``),
    and the seed is :func:`open_dataset`'s ``seed=``. ``DataSettings(max_tokens=..,
    seed=..)`` still works, with a ``DeprecationWarning``: it holds that section
    (``.data``) and the seed; an unset ``max_tokens`` is the section's default."""

    def __init__(self, *, seed: int = 0, limit: int | None = None, **fields: Any) -> None:
        warnings.warn(
            "DataSettings is deprecated and will be removed in 0.3.0: pass the [data] "
            "section, DataConfig(...) (dataset_limit=, not limit=), and open_dataset(..., "
            "seed=)",
            DeprecationWarning,
            stacklevel=2,
        )
        if limit is not None:
            if fields.get("dataset_limit") not in (None, limit):
                raise ValueError("give dataset_limit or its older name limit, not both")
            fields["dataset_limit"] = limit
        if fields.get("max_tokens", 0) is None:
            del fields["max_tokens"]
        self.data = DataConfig(**fields)
        self.seed = seed

    def __getattr__(self, name: str) -> Any:
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)

    @classmethod
    def of(cls, data: DataConfig, seed: int = 0) -> DataSettings:
        """The settings of a ``[data]`` section and a seed (deprecated)."""
        return cls(**dataclasses.asdict(data), seed=seed)


SOURCE_KINDS = (*TEXT_KINDS, "latents")
#: Files of which a folder a transformers tokenizer loads from holds at least one.
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
TOKENIZER_MARKERS += ("vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


def describe_sources() -> str:
    """One line listing what ``--dataset`` accepts (for help and errors)."""
    kinds = ", ".join(f"{k}:PATH" for k in SOURCE_KINDS)
    presets = ", ".join(list_workloads())
    return f"stdlib, a workload preset ({presets}), {kinds}, or package.module:factory"


def source_kind(spec: str) -> str | None:
    """What a ``--dataset`` string names, read in this one place (:func:`open_dataset`
    opens it, :func:`reads_text` asks whether it is text): ``stdlib``, ``preset`` (a
    workload preset), a text kind (:data:`TEXT_KINDS`) or ``latents`` before ``:PATH``,
    ``factory`` (``package.module:factory``), or None (no source we know)."""
    if spec == "stdlib":
        return "stdlib"
    if spec in list_workloads():
        return "preset"
    kind, sep, rest = spec.partition(":")
    if sep and kind in SOURCE_KINDS:
        return kind
    return "factory" if sep and rest.isidentifier() else None


def open_dataset(
    spec: str,
    settings: DataConfig | DataSettings | None = None,
    *,
    seed: int | None = None,
    draws: DiffusionDraws | None = None,
) -> Dataset:
    """The dataset named by ``spec`` (see the module docstring), read as the ``[data]``
    section ``settings`` says (unset: its defaults); ``seed``: the seed of synthetic
    data, workload presets, bucket keep draws and per-epoch noise (a run's ``[job]
    seed``; default 0); ``draws``: how a latent dataset draws each sample's time and
    caption (:mod:`datacentric.data.diffusion_draws`; unset: uniform, captions kept).
    Each source ignores the fields that do not apply to it."""
    if isinstance(settings, DataSettings):  # deprecated: a section and a seed
        settings, seed = settings.data, settings.seed if seed is None else seed
    s = DataConfig() if settings is None else settings
    seed = 0 if seed is None else int(seed)
    if s.long_docs not in LONG_DOC_RULES:
        raise DataError(f"--long-docs {s.long_docs!r}: use one of {', '.join(LONG_DOC_RULES)}")
    max_tokens = s.max_tokens
    kind = source_kind(spec)
    if draws is not None and not draws.default and kind != "latents":
        raise DataError(
            f"--dataset {spec}: training.caption_dropout and training.timestep_sampling "
            "apply to latents:DIR datasets only; leave them unset"
        )
    rest = spec.partition(":")[2]
    if kind == "factory":
        return _from_factory(spec, s, seed)
    if kind == "stdlib":
        return StdlibCorpus(max_tokens=max_tokens, limit=s.dataset_limit, long_docs=s.long_docs)
    if kind == "preset":
        shapes = preset_shapes(spec, seed, s.dataset_limit)
        if shapes[0].is_video:
            return SyntheticVideoDataset(shapes, seed=seed)
        return SyntheticTextDataset(shapes, seed=seed)
    if kind in TEXT_KINDS:
        return TokenizedTextDataset(
            kind,
            rest,
            tokenizer=s.tokenizer,
            text_field=s.text_field,
            max_tokens=max_tokens,
            long_docs=s.long_docs,
            limit=s.dataset_limit,
            loss_on=s.loss_on,
        )
    if kind == "latents":
        from datacentric.data.latents import LatentDataset

        return LatentDataset(
            rest, bucket_config=s.bucket_config, seed=seed, limit=s.dataset_limit, draws=draws
        )
    raise DataError(f"unknown dataset {spec!r}; use {describe_sources()}")


def _from_factory(spec: str, settings: DataConfig, seed: int) -> Dataset:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise DataError(f"dataset {spec}: cannot import it ({err})") from None
    if not callable(factory):
        raise DataError(f"dataset {spec}: {attr} is a {type(factory).__name__}, not a factory")
    values = {**dataclasses.asdict(settings), "seed": seed}
    values["limit"] = settings.dataset_limit  # the older name, which factories may take
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        values = {k: v for k, v in values.items() if k in params}
    dataset = factory(**values)
    missing = [a for a in ("__len__", "shapes", "loss_tokens", "pack") if not hasattr(dataset, a)]
    if missing:
        raise DataError(
            f"dataset {spec} returned a {type(dataset).__name__} without "
            f"{', '.join(missing)}; a dataset needs len, shapes(), loss_tokens(id) and "
            "pack(ids, pad_to_multiple, *, epoch) (see docs/data.md)"
        )
    return dataset


def build_run_data(
    data: DataConfig,
    validation: ValidationConfig,
    seed: int = 0,
    draws: DiffusionDraws | None = None,
) -> tuple[Dataset, Dataset | None]:
    """``(training set, held-out set or None)`` of the ``[data]`` and ``[validation]``
    sections and ``[job] seed`` (a ``dataset`` object is the held-out set as it is);
    ``limit`` keeps the first held-out samples (a split's others stay out of training);
    ``draws``: how a latent dataset draws each sample's caption and time (the
    ``[training]`` section's, :meth:`DiffusionDraws.of`; unset: their defaults)."""
    dataset = open_dataset(data.dataset, data, seed=seed, draws=draws)
    given = validation.dataset
    if given is None:
        return dataset, None
    if isinstance(given, str):  # split=FRACTION, or another --dataset string
        fraction = split_fraction(given)
        if fraction is None:
            settings = dataclasses.replace(data, dataset_limit=validation.limit)
            return dataset, open_dataset(given, settings, seed=seed, draws=draws)
        kept, held = split_ids(len(dataset), fraction, seed)
        return SampleSubset(dataset, kept), SampleSubset(dataset, held[: validation.limit])
    # a dataset object (the Python API)
    limit = len(given) if validation.limit is None else min(validation.limit, len(given))
    return dataset, given if limit == len(given) else SampleSubset(given, range(limit))


def skipped_samples(dataset: object) -> int:
    """Samples the dataset left out on request (its summary's ``samples_skipped``)."""
    summary = getattr(dataset, "summary", None)
    return int(summary().get("samples_skipped", 0)) if callable(summary) else 0


def skipped_note(dataset: object) -> str:
    """Why samples were left out, truthfully: empty documents (nothing to train on) and
    documents longer than ``max_tokens`` under ``long_docs = "skip"`` (asked for);
    ``""`` when none were."""
    summary = getattr(dataset, "summary", None)
    facts = summary() if callable(summary) else {}
    empty, long = int(facts.get("skipped_empty", 0)), int(facts.get("skipped_long", 0))
    no_loss = int(facts.get("skipped_no_loss", 0))
    total = int(facts.get("samples_skipped", empty + long + no_loss))
    if not total:
        return ""
    parts = [f"{empty} empty (no tokens)"] if empty else []
    if long:
        parts.append(f"{long} longer than data.max_tokens (data.long_docs = skip)")
    if no_loss:
        parts.append(f"{no_loss} with no assistant token (data.loss_on = assistant)")
    other = total - empty - long - no_loss
    if other:
        parts.append(f"{other} by the dataset")
    return f"{counted(total, 'sample')} skipped: {', '.join(parts)}"


def reads_text(data: DataConfig, validation: ValidationConfig) -> bool:
    """The run reads text through a tokenizer: a text dataset (``jsonl:``, ...) to train
    on or to validate on, or prompts to continue (not prompts a ``validation.pipeline``
    renders: its own text encoders read them)."""
    specs = (data.dataset, validation.dataset)
    kinds = [source_kind(s) for s in specs if isinstance(s, str)]
    continued = validation.prompts is not None and validation.pipeline is None
    return any(k in TEXT_KINDS for k in kinds) or continued


def holds_tokenizer(folder: str | Path) -> bool:
    """``folder`` holds a tokenizer's files (:data:`TOKENIZER_MARKERS`)."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_MARKERS)


def model_tokenizer(model: str, tokenizer: str | None) -> str | None:
    """The tokenizer a run of ``--model model`` reads text with: ``tokenizer`` when given
    (``bytes`` included); unset, the folder of an ``hf:DIR`` model, whose own tokenizer
    it is, and ``None`` (UTF-8 bytes) for every other model. :class:`DataError` for an
    ``hf:DIR`` folder that holds no tokenizer."""
    if tokenizer is not None or not model.startswith("hf:"):
        return tokenizer
    folder = Path(model.removeprefix("hf:")).expanduser()
    if not folder.is_dir():  # a tiny name (hf:qwen2): our own random-weight config
        return None
    if not holds_tokenizer(folder):
        raise DataError(
            f"--model {model}: the model folder holds no tokenizer; pass --tokenizer DIR (a "
            "folder saved with tokenizer.save_pretrained, or its tokenizer.json), or "
            f"--tokenizer {BYTES} for UTF-8 bytes"
        )
    return str(folder)


def with_model_tokenizer(
    model: ModelConfig, data: DataConfig, validation: ValidationConfig
) -> DataConfig:
    """The ``[data]`` section with the tokenizer text is read with, by ``train`` and by
    the planning commands alike: the one given, else an ``hf:DIR`` model's own (its
    folder; :func:`model_tokenizer`, which refuses a
    folder without one); unchanged when the run reads no text or uses bytes."""
    if data.tokenizer is not None or not reads_text(data, validation):
        return data
    chosen = model_tokenizer(model.model, None)
    return data if chosen is None else dataclasses.replace(data, tokenizer=chosen)
