"""What a ``--model`` string and the ``[lora]`` section resolve to, before anything is
built: the :class:`ModelSource` every model kind's builder takes, its arguments as a
command line gives them (``--model-arg KEY=VALUE``) and their check against what the
model takes, the checks of a model folder's files, the :class:`LoraSpec` of the adapters
it carries (:func:`lora_of`, the one conversion of the section; injected by
:mod:`datacentric.models.lora`), and the error each raises. Torch-free, so the commands
that only price a model (``plan``, ``schedule``, ``simulate``) read them without
importing torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datacentric.regular_files import read_json_file

ALL_LINEAR = "all-linear"
"""peft's shorthand target: every linear layer but a transformers model's output head,
chosen by peft itself."""


class LoraError(ValueError):
    """A LoRA setting that cannot apply to the model (no such module, no peft)."""


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA adapts and how (``[lora]`` settings)."""

    rank: int
    """Rank ``r`` of every adapter (``B A`` with ``A: r x in``, ``B: out x r``)."""
    alpha: float | None = None
    """Scale numerator: an adapter adds ``alpha / rank * B A x`` (None: ``alpha = rank``)."""
    dropout: float = 0.0
    """Dropout on each adapter's input (training mode only)."""
    targets: tuple[str, ...] | None = None
    """Module names to adapt (None: :data:`DEFAULT_TARGETS` of the model's family;
    ``("all-linear",)``: the layers peft's shorthand adapts, resolved to their full names
    once injected)."""

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "targets": list(self.targets) if self.targets is not None else None,
        }


def lora_spec(
    rank: int, alpha: float | None = None, dropout: float = 0.0, targets: str | None = None
) -> LoraSpec | None:
    """The spec of ``[lora]`` settings; ``None`` when ``rank`` is 0 (LoRA off)."""
    if rank < 0:
        raise LoraError(f"lora.rank {rank}: give 0 (off) or a positive rank")
    if not rank:
        return None
    if not 0 <= dropout < 1:
        raise LoraError(f"lora.dropout {dropout}: give a probability in [0, 1)")
    names = None
    if targets:
        names = tuple(t.strip() for t in targets.split(",") if t.strip())
        if not names:
            raise LoraError(f"lora.targets {targets!r}: name at least one module")
        if ALL_LINEAR in (n.lower() for n in names) and len(names) > 1:
            raise LoraError(
                f"lora.targets {targets!r}: {ALL_LINEAR} stands alone (peft's shorthand for "
                "every linear layer but the output head); drop the other names"
            )
        if names[0].lower() == ALL_LINEAR:
            names = (ALL_LINEAR,)
    return LoraSpec(int(rank), alpha, float(dropout), names)


def lora_of(lora: Any) -> LoraSpec | None:
    """The ``[lora]`` section (``rank``, ``alpha``, ``dropout``, ``targets``: a
    :class:`~datacentric.settings.sections.LoraConfig`) as a spec (``None``: LoRA off):
    the one conversion, whether the section comes from a command's settings, its flags
    or a run's record."""
    return lora_spec(lora.rank, lora.alpha, lora.dropout, lora.targets)


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


def model_held(folder: Path) -> tuple[str, str] | None:
    """The kind of ``--model`` source (``hf``, ``diffusers``) ``folder`` holds, and what
    it holds, where it holds a model: a diffusers pipeline (``model_index.json``), a
    transformers model (``config.json`` with a ``model_type``) or a diffusers model
    (``config.json`` with a ``_class_name``); ``None`` otherwise. Reads JSON only: a
    ``config.json`` that does not read is a :class:`ModelSourceError` naming it."""
    if (folder / "model_index.json").is_file():
        return "diffusers", "a diffusers pipeline (model_index.json)"
    if not (folder / "config.json").is_file():
        return None
    config = read_json_file(folder / "config.json", error=ModelSourceError)
    if "model_type" in config:
        return "hf", "a Hugging Face transformers model (config.json with a model_type)"
    if "_class_name" in config:
        return "diffusers", "a diffusers model (config.json with a _class_name)"
    return None


def check_loaded_weights(name: str, folder: Path, model_class: str, loading: Mapping) -> None:
    """Every parameter of a model read from ``folder`` came from its weight files:
    ``loading`` is what transformers' or diffusers' ``from_pretrained(...,
    output_loading_info=True, ignore_mismatched_sizes=True)`` returns beside the model. A
    tensor the files lack (a head not saved, keys saved under another prefix) or hold at
    another shape would start from random values, which those libraries only log: one
    line naming them, and the files' tensors the model does not use."""
    missing = sorted(loading.get("missing_keys") or ())
    mismatched = sorted(loading.get("mismatched_keys") or ())
    if not (missing or mismatched):
        return
    needed = "tensor it needs is" if len(missing) == 1 else "tensors it needs are"
    what = [f"{len(missing)} {needed} not there ({_few(missing)})"] if missing else []
    for key, found, wanted in mismatched[:3]:
        what.append(f"{key} is {tuple(found)} there but {tuple(wanted)} in the model")
    unused = sorted(loading.get("unexpected_keys") or ())
    if unused:
        what.append(f"{len(unused)} there are unused ({_few(unused)})")
    raise ModelSourceError(
        f"model {name!r}: the weights in {folder} do not fit {model_class}: "
        + "; ".join(what)
        + "; those parameters would train from random values (save the model again with "
        "save_pretrained, or check config.json and the model arguments)"
    )


def _few(keys: list[str], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (", ..." if len(keys) > shown else "")


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


#: scheduler ``prediction_type`` values that sample by the velocity training regresses
FLOW_PREDICTIONS = ("flow_prediction",)


def check_pipeline_scheduler(name: str, folder: Path) -> None:
    """The pipeline folder a diffusers model sits in (``folder``, or the folder above a
    ``transformer/`` one) samples by flow matching, the objective ``train`` regresses
    (rectified flow's velocity ``noise - x0``): its scheduler is a ``FlowMatch*`` class or
    predicts ``flow_prediction`` (Wan's UniPC). A v-prediction or epsilon scheduler
    (CogVideoX's ``CogVideoXDDIMScheduler``) would sample the trained transformer as
    another kind of model, so it is one line naming it, as is a scheduler config that
    does not read (a JSON object). A folder outside any pipeline, or a pipeline without
    a scheduler config, passes."""
    pipeline = folder if (folder / "model_index.json").is_file() else folder.parent
    path = pipeline / "scheduler" / "scheduler_config.json"
    if not (pipeline / "model_index.json").is_file() or not path.exists():
        return
    config = read_json_file(path, error=ModelSourceError)
    cls = str(config.get("_class_name", ""))
    prediction = config.get("prediction_type")
    if cls.startswith("FlowMatch") or prediction in FLOW_PREDICTIONS:
        return
    raise ModelSourceError(
        f"model {name!r}: its pipeline samples with {cls or 'a scheduler'} (prediction_type "
        f"{prediction!r}, {path}), and train regresses rectified flow's velocity (noise - "
        "x0), so that pipeline would not render the trained transformer; train a model "
        "whose pipeline's scheduler is a flow-matching one (FlowMatchEulerDiscreteScheduler, "
        "or prediction_type 'flow_prediction')"
    )
