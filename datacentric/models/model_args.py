"""What a ``--model`` string resolves to, before anything is built: the
:class:`ModelSource` every model kind's builder takes, its arguments as a command line
gives them (``--model-arg KEY=VALUE``) and their check against what the model takes, the
checks of a model folder's files, and the error each raises. Torch-free, so the commands
that only price a model (``plan``, ``schedule``, ``simulate``) read them without
importing torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datacentric.models.lora_settings import LoraSpec


class ModelSourceError(ValueError):
    """A ``--model`` string or model argument that names no model we can build."""


def parse_model_args(pairs: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--model-arg``) as a dict; a value is read as JSON when
    it is JSON (``2``, ``0.5``, ``true``, ``[1, 2]``), else kept as a string. A mapping
    (a TOML table) passes through."""
    if pairs is None:
        return {}
    if isinstance(pairs, Mapping):
        return dict(pairs)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ModelSourceError(f"model argument {pair!r} is not KEY=VALUE (--model-arg)")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``--model`` string and its keyword arguments."""

    name: str
    """The string as the user gave it."""
    kind: str
    """``preset``, ``hf``, ``diffusers`` or ``factory``."""
    target: str
    """Preset name, tiny model name, folder, or ``pkg.module:factory``."""
    folder: Path | None = None
    """The model folder (``hf:DIR``, ``diffusers:DIR``); ``None`` otherwise."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments: config fields or the factory's parameters."""
    lora: LoraSpec | None = None
    """LoRA adapters to inject after building (:mod:`datacentric.models.lora`); ``None``:
    every parameter trains."""
    pipeline: Path | None = None
    """The diffusers pipeline folder ``folder`` is the ``transformer/`` of, if any."""

    @property
    def has_weights(self) -> bool:
        """The folder holds pretrained weights (safetensors)."""
        return self.folder is not None and bool(weight_files(self.folder))


#: Files of a PEFT adapter saved with ``save_pretrained``: transformers attaches such an
#: adapter to the model it loads from the same folder, unasked.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors weight files of a model folder (sharded or not)."""
    return sorted(p for p in folder.glob("*.safetensors") if p.name not in ADAPTER_FILES)


#: Endings of weight files that are pickles (reading one can run code).
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def pickled_only(folder: Path) -> list[Path]:
    """The pickled weight files of a model folder that has no safetensors weights
    (empty when it has safetensors weights, or no pickled ones)."""
    if not folder.is_dir() or weight_files(folder):
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in PICKLE_WEIGHTS and p.is_file())


def check_model_folder(name: str, folder: Path) -> None:
    """A model folder holds a ``config.json``, no PEFT adapter beside the model
    (transformers would load it and attach it, so the run would train base + adapter
    without a word) and weights that are not pickles only; else one line saying so."""
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"model {name!r}: {folder} holds no config.json (save the model with save_pretrained)"
        )
    found = [f for f in ADAPTER_FILES if (folder / f).exists()]
    if found:
        raise ModelSourceError(
            f"model {name!r}: {folder} also holds a PEFT adapter ({', '.join(found)}), which "
            "transformers would attach to the model unasked; train from a folder holding the "
            "base model only (or merge the adapter into it first: peft's merge_and_unload, "
            "then save_pretrained)"
        )
    pickled = pickled_only(folder)
    if pickled:
        raise ModelSourceError(
            f"model {name!r}: {folder} holds only pickled *{pickled[0].suffix} "
            "weights, which can "
            "run code when read; save them as safetensors "
            "(save_pretrained(..., safe_serialization=True))"
        )


def check_model_args(source: ModelSource, accepted: Iterable[str], what: str) -> None:
    """Refuse model arguments that ``what`` does not take, naming them and the choices;
    ``accepted`` a mapping of defaults: also those whose value is not of the default's
    type (an integer setting given ``abc``)."""
    defaults = accepted if isinstance(accepted, Mapping) else {}
    accepted = set(accepted)
    unknown = sorted(set(source.args) - accepted)
    if unknown:
        shown = ", ".join(sorted(accepted)) if len(accepted) <= 40 else f"{len(accepted)} keys"
        raise ModelSourceError(
            f"model {source.name!r}: {what} takes no {', '.join(unknown)} "
            f"(--model-arg; it takes: {shown})"
        )
    for key, value in source.args.items():
        kind = next((k for k in _ARG_TYPES if isinstance(defaults.get(key), k)), None)
        if kind is not None and not _ARG_TYPES[kind](value):
            raise ModelSourceError(
                f"model {source.name!r}: --model-arg {key}={value!r}: {what}'s {key} is "
                f"{kind.__name__} (default {defaults[key]!r}), not {type(value).__name__}"
            )


#: a setting's type (its default's, most specific first) -> which values it takes
_ARG_TYPES = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
