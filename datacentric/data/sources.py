"""One function from a ``--dataset`` string to a :class:`~datacentric.data.base.Dataset`.

- ``stdlib``: the embedded standard-library corpus;
- a workload preset name (``opensora-short``, ``sft-longtail``, ...): its shapes as
  synthetic data (video latents for video presets, random bytes for text);
- ``jsonl:PATH_OR_GLOB``, ``parquet:PATH_OR_GLOB``, ``text:PATH_OR_GLOB``,
  ``hf-datasets:DIR``: tokenized documents (:mod:`datacentric.data.tokenized`);
- ``latents:DIR`` (or a manifest file): video latents (:mod:`datacentric.data.latents`);
- ``package.module:factory``: ``factory(**settings)`` returns a dataset; it receives
  those of :class:`DataSettings`' fields that it names as parameters (all of them if
  it takes ``**kwargs``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from dataclasses import InitVar, dataclass

from datacentric.data.base import DataError, Dataset
from datacentric.data.stdlib import DEFAULT_MAX_TOKENS, StdlibCorpus
from datacentric.data.text import SyntheticTextDataset
from datacentric.data.tokenized import LONG_DOC_RULES, TEXT_KINDS, TokenizedTextDataset
from datacentric.data.video import SyntheticVideoDataset
from datacentric.data.workloads import get_workload, list_workloads
from datacentric.settings.sections import DataConfig


@dataclass(kw_only=True)
class DataSettings(DataConfig):
    """The ``[data]`` section (:class:`~datacentric.settings.sections.DataConfig`: the
    same fields, docs and checks as ``datacentric train`` reads) and the seed a source
    draws with; each source ignores the fields that do not apply to it."""

    max_tokens: int | None = None
    """Longest text sample (None: the source's default, 8192; ``datacentric train``'s
    ``[data] max_tokens`` is 4096); longer documents follow ``long_docs``."""
    seed: int = 0
    """Seed of synthetic data, workload presets, bucket keep draws and per-epoch noise
    (``[job] seed`` in a run)."""
    limit: InitVar[int | None] = None
    """Older name of ``dataset_limit`` (deprecated; either may be given, not both)."""

    def __post_init__(self, limit: int | None) -> None:
        if limit is not None:
            warnings.warn(
                "DataSettings(limit=...) is deprecated; use dataset_limit=, the [data] key",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.dataset_limit not in (None, limit):
                raise ValueError(
                    "give DataSettings.dataset_limit or its older name limit, not both"
                )
            self.dataset_limit = limit

    @classmethod
    def of(cls, data: DataConfig, seed: int = 0) -> DataSettings:
        """The settings of a ``[data]`` section and a seed."""
        return cls(**dataclasses.asdict(data), seed=seed)


def data_settings(data: DataConfig, seed: int = 0) -> DataSettings:
    """The data settings of a run (its ``[data]`` section and ``[job] seed``): the one
    place they meet, so ``train``, ``profile``, ``plan``, ``schedule`` and ``bench`` open
    the same samples."""
    return DataSettings.of(data, seed)


SOURCE_KINDS = (*TEXT_KINDS, "latents")


def describe_sources() -> str:
    """One line listing what ``--dataset`` accepts (for help and errors)."""
    kinds = ", ".join(f"{k}:PATH" for k in SOURCE_KINDS)
    presets = ", ".join(list_workloads())
    return f"stdlib, a workload preset ({presets}), {kinds}, or package.module:factory"


def open_dataset(
    spec: str, settings: DataConfig | None = None, *, seed: int | None = None
) -> Dataset:
    """The dataset named by ``spec`` (see the module docstring), read as the ``[data]``
    section ``settings`` says (a :class:`DataSettings`, or the section itself, with
    ``seed``: the seed of synthetic data, default the settings' own or 0)."""
    if isinstance(settings, DataSettings):
        s = settings
    else:
        s = DataSettings() if settings is None else DataSettings.of(settings)
    if seed is not None:
        s = dataclasses.replace(s, seed=seed)
    if s.long_docs not in LONG_DOC_RULES:
        raise DataError(f"--long-docs {s.long_docs!r}: use one of {', '.join(LONG_DOC_RULES)}")
    max_tokens = s.max_tokens or DEFAULT_MAX_TOKENS
    if spec == "stdlib":
        return StdlibCorpus(max_tokens=max_tokens, limit=s.dataset_limit, long_docs=s.long_docs)
    if spec in list_workloads():
        shapes = list(get_workload(spec, seed=s.seed, num_samples=s.dataset_limit).shapes)
        if shapes[0].is_video:
            return SyntheticVideoDataset(shapes, seed=s.seed)
        return SyntheticTextDataset(shapes, seed=s.seed)
    kind, sep, rest = spec.partition(":")
    if sep and kind in TEXT_KINDS:
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
    if sep and kind == "latents":
        from datacentric.data.latents import LatentDataset

        return LatentDataset(
            rest, bucket_config=s.bucket_config, seed=s.seed, limit=s.dataset_limit
        )
    if sep and rest.isidentifier():
        return _from_factory(kind, rest, s)
    raise DataError(f"unknown dataset {spec!r}; use {describe_sources()}")


def _from_factory(module_name: str, attr: str, settings: DataSettings) -> Dataset:
    spec = f"{module_name}:{attr}"
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise DataError(f"dataset {spec}: cannot import it ({err})") from None
    if not callable(factory):
        raise DataError(f"dataset {spec}: {attr} is a {type(factory).__name__}, not a factory")
    values = dataclasses.asdict(settings)
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
    return f"{total} sample{'s' if total != 1 else ''} skipped: {', '.join(parts)}"
