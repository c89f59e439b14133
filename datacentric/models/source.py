"""Where a model comes from: the one resolver of ``--model`` strings.

Every command that takes ``--model`` (train, profile, plan, schedule, bench,
equivalence) and the Python API resolve the string here:

- a preset of :mod:`datacentric.models.presets` (``llama``, ``dit``, ``llama-7b``, ...);
- ``hf:PATH_OR_NAME``: a folder holding a transformers ``config.json`` loads the
  pretrained causal LM with ``from_pretrained`` from local files only (weights as
  safetensors, sharded or not); a folder with only ``config.json`` builds random
  weights; a tiny name (``hf:qwen2``, ...) builds the small random-weight config of
  :data:`datacentric.models.hf.TINY_CONFIGS`;
- ``diffusers:PATH_OR_NAME``: the same for a diffusers video transformer folder, or a
  tiny name (``diffusers:wan``, ...); a pipeline folder (``model_index.json``) means
  its ``transformer/`` subfolder, and ``export`` writes the pipeline back around it;
- ``pkg.module:factory``: the user's own code, called with the model arguments as
  keyword arguments; it returns the model, or ``(model, dataset)``.

Model arguments (``--model-arg KEY=VALUE``, repeatable) are checked against what the
model takes: a preset's config fields, a transformers/diffusers config's keys, a
factory's parameters. Random weights come from the global torch RNG: seed it first
(the trainer seeds it from ``--seed``) so every rank holds the same weights.

This module only resolves and dispatches: each kind's builder lives beside its models
(:func:`~datacentric.models.presets.build_preset_source`,
:func:`~datacentric.models.hf.build_hf_source`,
:func:`~datacentric.models.diffusers_build.build_diffusers_source`,
:func:`~datacentric.models.user_factory.build_factory_source`), and what they share (the
:class:`ModelSource`, the checks of its arguments and folder) in the torch-free
:mod:`datacentric.models.model_args`.

Opening a folder never runs code from it: ``trust_remote_code`` stays off, and only
safetensors weights are read (a folder with pickled ``*.bin`` weights alone is refused).
A folder is trained as what it holds: one that also holds a PEFT adapter
(``adapter_config.json``, ``adapter_model.safetensors``), which transformers would attach
unasked, is refused in one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.models.configs import DiTConfig
from datacentric.models.dit import VideoDiT
from datacentric.models.llama import Llama
from datacentric.models.lora import apply_lora
from datacentric.models.model_args import (
    ADAPTER_FILES,
    PICKLE_WEIGHTS,
    ModelSource,
    ModelSourceError,
    check_model_args,
    check_model_folder,
    model_held,
    parse_model_args,
    pickled_only,
    weight_files,
)
from datacentric.models.presets import MODEL_PRESETS, build_preset_source
from datacentric.models.user_factory import build_factory_source, factory_of

HF_PREFIX = "hf:"
DIFFUSERS_PREFIX = "diffusers:"
KINDS = ("preset", "hf", "diffusers", "factory")

__all__ = [  # what a model kind needs lives beside its builder; these names stay here too
    "ADAPTER_FILES",
    "PICKLE_WEIGHTS",
    "ModelSource",
    "ModelSourceError",
    "build_from_source",
    "build_model_named",
    "check_model_args",
    "factory_of",
    "inner_pretrained",
    "parse_model_args",
    "pickled_only",
    "resolve_model",
    "tiny_names",
    "weight_files",
]


def resolve_model(name: str, args: Iterable[str] | Mapping[str, Any] | None = None) -> ModelSource:
    """The :class:`ModelSource` that ``name`` means (no model is built)."""
    values = parse_model_args(args)
    if name in MODEL_PRESETS:
        return ModelSource(name, "preset", name, args=values)
    for prefix, kind in ((HF_PREFIX, "hf"), (DIFFUSERS_PREFIX, "diffusers")):
        if name.startswith(prefix):
            target = name.removeprefix(prefix)
            folder = Path(target).expanduser()
            pipeline = None
            if kind == "diffusers" and (folder / "model_index.json").is_file():
                pipeline, folder = folder, folder / "transformer"
            if folder.is_dir():
                check_model_folder(name, folder)
                return ModelSource(
                    name, kind, str(folder), folder=folder, args=values, pipeline=pipeline
                )
            tiny = tiny_names(kind)
            if target not in tiny:
                raise ModelSourceError(
                    f"model {name!r}: no folder {target!r} with a config.json, and no tiny "
                    f"{kind} model of that name (tiny names: {', '.join(tiny) or 'none'})"
                )
            return ModelSource(name, kind, target, args=values)
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not module_name or not attr.isidentifier():
            raise ModelSourceError(f"model {name!r} is not pkg.module:factory")
        return ModelSource(name, "factory", name, args=values)
    folder = os.path.expanduser(name)  # as given where ~user names no user
    try:  # os.path.isdir: False for a name too long to be a path
        held = model_held(Path(folder)) if os.path.isdir(folder) else None
    except ModelSourceError as err:  # a folder whose config.json does not read
        raise ModelSourceError(f"model {name!r}: {err}") from None
    prefix = {"hf": HF_PREFIX, "diffusers": DIFFUSERS_PREFIX}[held[0]] if held else ""
    hint = f", a folder holding {held[1]}: give --model {prefix}{name}; or" if held else ";"
    raise ModelSourceError(
        f"unknown model {name!r}{hint} use a preset ({', '.join(MODEL_PRESETS)}), "
        "hf:DIR_OR_NAME, diffusers:DIR_OR_NAME or pkg.module:factory"
    )


def tiny_names(kind: str) -> list[str]:
    """The tiny random-weight models of ``kind`` (``hf`` or ``diffusers``) installed here."""
    try:
        if kind == "hf":
            from datacentric.models.hf import TINY_CONFIGS

            return sorted(TINY_CONFIGS)
        from datacentric.models.diffusers_build import tiny_names as diffusers_tiny

        return sorted(diffusers_tiny())
    except ImportError:  # the extra is not installed
        return []


def build_from_source(
    source: ModelSource,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    dataset: Any = None,
) -> tuple[nn.Module, Any]:
    """The model ``source`` names, and the dataset its factory returned (else ``None``).

    ``device="meta"`` builds without weights (pretrained weights are not read), for the
    checks made before ranks start. ``dataset`` lets a preset follow the data (latent
    channels, vocabulary): data of the other kind is refused before it is built
    (:class:`DataKindError`, :func:`check_data_kind`; other kinds' models may be built
    beside any data). ``source.lora`` adapters are injected last, the rest frozen.
    """
    if source.kind == "preset":  # it follows the data, of its own kind only
        check_data_kind(source, dataset)
    model, data = _build_source(source, dtype=dtype, device=device, dataset=dataset)
    if source.lora is not None:
        apply_lora(model, source.lora)
    return model, data


TEXT = "text"
VIDEO = "video latents"
CAPTIONED = "video latents with their text embeddings"
#: how to give the data each kind of model trains on
DATA_FIX = {
    TEXT: "give text (--dataset stdlib, jsonl:FILE, parquet:FILE or text:FILE)",
    VIDEO: "give video (--dataset latents:DIR, or a video workload preset: opensora-short, ...)",
    CAPTIONED: "give --dataset latents:DIR with text embeddings (datacentric prepare writes one)",
}


class DataKindError(ValueError):
    """A model given data of the other kind: a text model given video, a video model
    given text, a diffusers model given data without text embeddings. ``named`` says it
    with the settings that chose them."""

    def __init__(self, name: str, wants: str, holds: str) -> None:
        self.name, self.wants, self.holds = name, wants, holds
        super().__init__(self.named(f"model {name!r}", "the dataset"))

    def named(self, model: str, data: str) -> str:
        """The line, naming the model as ``model`` and the data as ``data``."""
        return (
            f"{model} trains on {self.wants}, and {data} holds {self.holds}: {DATA_FIX[self.wants]}"
        )


#: our adapters of unmodified models (module, class), by what they train on; looked up
#: only where the module is loaded (a model of the class exists only then)
ADAPTER_KINDS = {
    ("datacentric.models.hf", "HFCausalLM"): TEXT,
    ("datacentric.models.diffusers_generic", "DiffusersVideoTransformer"): CAPTIONED,
    ("datacentric.models.diffusers_video", "DiffusersVideoModel"): CAPTIONED,
}


def check_data_kind(source: ModelSource | nn.Module, dataset: Any) -> None:
    """Raise :class:`DataKindError` when ``dataset`` holds data of another kind than the
    model ``source`` names (or is: a built model, named by its class) trains on: text
    for a preset Llama or an ``hf:`` model, video latents for a preset DiT, video
    latents with their text embeddings for a ``diffusers:`` model. A factory's model
    (any other module), no dataset or data of both kinds pass (what we cannot tell, the
    model's own check decides). Reads the dataset's shapes (and packs its shortest
    sample for a ``diffusers:`` model); builds nothing."""
    if isinstance(source, nn.Module):
        name, wants = type(source).__name__, _module_wants(source)
    elif source.kind == "preset":
        video = isinstance(MODEL_PRESETS[source.target].config, DiTConfig)
        name, wants = source.name, VIDEO if video else TEXT
    else:
        name, wants = source.name, {"hf": TEXT, "diffusers": CAPTIONED}.get(source.kind)
    holds = None if wants is None or dataset is None else _data_kind(dataset, wants)
    if holds is not None and holds != wants:
        raise DataKindError(name, wants, holds)


def _module_wants(model: nn.Module) -> str | None:
    """What a built ``model`` trains on: a preset's by its class (compiled too), our
    adapters' by :data:`ADAPTER_KINDS`; ``None`` for any other model (a user's own that
    holds a public ``LlamaConfig`` or ``DiTConfig`` included)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if isinstance(inner, Llama | VideoDiT):
        return VIDEO if isinstance(inner, VideoDiT) else TEXT
    for (module, name), kind in ADAPTER_KINDS.items():
        adapter = getattr(sys.modules.get(module), name, None)
        if adapter is not None and isinstance(model, adapter):
            return kind
    return None


def _data_kind(dataset: Any, wants: str) -> str | None:
    """What ``dataset`` holds (:data:`TEXT`, :data:`VIDEO`, :data:`CAPTIONED` or video
    latents without them), or ``None`` when it cannot be told (no shapes, both kinds, a
    sample that does not pack). Text embeddings are looked for only when ``wants`` them,
    in its shortest sample packed."""
    shapes = list(getattr(dataset, "shapes", list)())
    video = {shape.is_video for shape in shapes}
    if len(video) != 1:
        return None
    if not video.pop():
        return TEXT
    if wants != CAPTIONED:
        return VIDEO
    shortest = min(range(len(shapes)), key=lambda i: shapes[i].tokens)
    try:
        context = getattr(dataset.pack([shortest]), "sample_context", None)
    except Exception:  # a dataset that does not pack here: the model's check decides
        return None
    return CAPTIONED if context is not None else "video latents without text embeddings"


def _build_source(
    source: ModelSource, *, dtype: torch.dtype, device: Any, dataset: Any
) -> tuple[nn.Module, Any]:
    """The builder of ``source``'s kind, each beside its models."""
    if source.kind == "preset":
        return build_preset_source(source, dtype=dtype, device=device, dataset=dataset), None
    if source.kind == "hf":
        from datacentric.models.hf import build_hf_source

        return build_hf_source(source, dtype=dtype, device=device), None
    if source.kind == "diffusers":
        from datacentric.models.diffusers_build import build_diffusers_source

        return build_diffusers_source(source, dtype=dtype, device=device), None
    return build_factory_source(source, dtype=dtype, device=device)


def build_model_named(
    name: str,
    args: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    dataset: Any = None,
) -> nn.Module:
    """:func:`resolve_model` then :func:`build_from_source`; the model only."""
    return build_from_source(
        resolve_model(name, args), dtype=dtype, device=device, dataset=dataset
    )[0]


def inner_pretrained(model: nn.Module) -> Any:
    """The unmodified transformers or diffusers model inside our adapter (the object
    that ``save_pretrained`` writes), or ``None`` for other models."""
    for attr in ("hf", "diffusers_model", "transformer"):
        inner = getattr(model, attr, None)
        if inner is not None and hasattr(inner, "save_pretrained"):
            return inner
    return None
