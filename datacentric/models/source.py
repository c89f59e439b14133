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

Opening a folder never runs code from it: ``trust_remote_code`` stays off, and only
safetensors weights are read (a folder with pickled ``*.bin`` weights alone is refused).
A folder is trained as what it holds: one that also holds a PEFT adapter
(``adapter_config.json``, ``adapter_model.safetensors``), which transformers would attach
unasked, is refused in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.models.lora import LoraSpec, apply_lora
from datacentric.models.model_args import ModelSourceError, parse_model_args
from datacentric.models.presets import MODEL_PRESETS, build_model, model_config
from datacentric.regular_files import check_regular, read_json_file

HF_PREFIX = "hf:"
DIFFUSERS_PREFIX = "diffusers:"
KINDS = ("preset", "hf", "diffusers", "factory")


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


def _refuse_adapter(name: str, folder: Path) -> None:
    """A model folder that also holds a PEFT adapter is refused: transformers would load
    the adapter and attach it, so the run would train base + adapter without a word."""
    found = [f for f in ADAPTER_FILES if (folder / f).exists()]
    if found:
        raise ModelSourceError(
            f"model {name!r}: {folder} also holds a PEFT adapter ({', '.join(found)}), which "
            "transformers would attach to the model unasked; train from a folder holding the "
            "base model only (or merge the adapter into it first: peft's merge_and_unload, "
            "then save_pretrained)"
        )


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
                if not (folder / "config.json").is_file():
                    raise ModelSourceError(
                        f"model {name!r}: {folder} holds no config.json (save the model with "
                        "save_pretrained)"
                    )
                _refuse_adapter(name, folder)
                pickled = pickled_only(folder)
                if pickled:
                    raise ModelSourceError(
                        f"model {name!r}: {folder} holds only pickled *{pickled[0].suffix} "
                        "weights, which can "
                        "run code when read; save them as safetensors "
                        "(save_pretrained(..., safe_serialization=True))"
                    )
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
    raise ModelSourceError(
        f"unknown model {name!r}; use a preset ({', '.join(MODEL_PRESETS)}), hf:DIR_OR_NAME, "
        "diffusers:DIR_OR_NAME or pkg.module:factory"
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


def factory_of(source: ModelSource) -> Any:
    """The user's factory callable of a ``pkg.module:factory`` source."""
    module_name, _, attr = source.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelSourceError(
            f"model {source.name!r}: cannot import {module_name!r} ({error})"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSourceError(f"model {source.name!r}: {module_name} has no callable {attr!r}")
    return factory


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


def _dataset_overrides(source: ModelSource, dataset: Any) -> dict[str, Any]:
    """Preset fields the dataset sets: latent channels, a tokenizer larger than the
    preset's vocabulary (explicit model arguments win)."""
    overrides: dict[str, Any] = {}
    token_dim = getattr(dataset, "token_dim", None)
    if token_dim is not None:
        overrides["in_channels"] = token_dim
    vocab_size = getattr(dataset, "vocab_size", None)
    preset_vocab = getattr(MODEL_PRESETS[source.target].config, "vocab_size", None)
    if vocab_size and preset_vocab is not None and vocab_size > preset_vocab:
        overrides["vocab_size"] = vocab_size
    return overrides


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
    channels, vocabulary). ``source.lora`` adapters are injected last, the rest frozen.
    """
    model, data = _build_source(source, dtype=dtype, device=device, dataset=dataset)
    if source.lora is not None:
        apply_lora(model, source.lora)
    return model, data


def _build_source(
    source: ModelSource, *, dtype: torch.dtype, device: Any, dataset: Any
) -> tuple[nn.Module, Any]:
    on_meta = str(device) == "meta"
    if source.kind == "preset":
        config = model_config(source.target)
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        check_model_args(source, fields, source.target)
        overrides = {**_dataset_overrides(source, dataset), **source.args}
        return build_model(source.target, dtype=dtype, device=device, **overrides), None
    if source.kind == "hf":
        return _build_hf(source, dtype, device, on_meta), None
    if source.kind == "diffusers":
        return _build_diffusers(source, dtype, device, on_meta), None
    factory = factory_of(source)
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        check_model_args(source, params, f"factory {source.target}")
    with torch.device(device) if device is not None else contextlib.nullcontext():
        made = factory(**source.args)
    model, data = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ModelSourceError(
            f"model {source.name!r}: the factory returned {type(model).__name__}, not an "
            "nn.Module (or a (model, dataset) pair)"
        )
    return model.to(dtype=dtype), data


def _build_hf(source: ModelSource, dtype: torch.dtype, device: Any, on_meta: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    from datacentric.models.hf import HFCausalLM, build_hf_model, tiny_hf_config

    if source.folder is None:
        base = tiny_hf_config(source.target)
        check_model_args(source, base.to_dict(), f"hf:{source.target}'s config")
        with torch.device(device) if device is not None else contextlib.nullcontext():
            return build_hf_model(source.target, dtype=dtype, **source.args)
    config = _folder_config(source)
    check_model_args(source, config.to_dict(), f"{source.folder}/config.json")
    for key, value in source.args.items():
        setattr(config, key, value)
    config.use_cache = False
    if on_meta or not source.has_weights:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            hf_model = AutoModelForCausalLM.from_config(
                config, trust_remote_code=False, **_dtype_kwarg(dtype)
            )
    else:
        _check_weight_files(source)
        hf_model = AutoModelForCausalLM.from_pretrained(
            source.folder,
            config=config,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            **_dtype_kwarg(dtype),
        )
    model = HFCausalLM(hf_model)
    return model.to(device=device, dtype=dtype) if device is not None else model.to(dtype=dtype)


def _check_weight_files(source: ModelSource) -> None:
    """Every safetensors file of the folder has a readable header (else one line naming
    it, not the library's error)."""
    from safetensors import safe_open

    for file in weight_files(source.folder):
        check_regular(file)  # safetensors' own open would block on a FIFO
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: a bad file
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            raise ModelSourceError(
                f"model {source.name!r}: {file} is not a readable safetensors file ({why}); "
                "save the model again with save_pretrained"
            ) from None


def _folder_config(source: ModelSource) -> Any:
    """The transformers config of an ``hf:DIR`` folder, its code never run (nor asked
    about): a ``model_type`` transformers does not ship is refused, naming it."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    file = source.folder / "config.json"
    try:
        values = read_json_file(file, error=ModelSourceError)
    except ModelSourceError as err:
        raise ModelSourceError(f"model {source.name!r}: {err}") from None
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        code = values.get("auto_map")
        raise ModelSourceError(
            f"model {source.name!r}: {file} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know"
            + (
                " (the folder's auto_map names its own code, which datacentric never runs)"
                if code
                else ""
            )
            + "; save the model as a type transformers ships"
        )
    try:
        return AutoConfig.from_pretrained(
            source.folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # noqa: BLE001 - transformers' checks raise several types
        why = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()[:200]
        raise ModelSourceError(
            f"model {source.name!r}: {file}: not a usable config ({why})"
        ) from None


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """transformers' dtype keyword: ``dtype`` since 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _build_diffusers(
    source: ModelSource, dtype: torch.dtype, device: Any, on_meta: bool
) -> nn.Module:
    from datacentric.models.diffusers_build import build_diffusers_model

    if on_meta and source.folder is not None:
        # the config alone (no weights read): a folder holding only its config.json
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy2(source.folder / "config.json", Path(scratch) / "config.json")
            with torch.device(device):
                return build_diffusers_model(scratch, dtype=dtype, **source.args)
    target = str(source.folder) if source.folder is not None else source.target
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return build_diffusers_model(target, dtype=dtype, **source.args)


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


def truncate_blocks(model: nn.Module, depth: int) -> None:
    """Keep only the first ``depth`` of ``model.blocks``, wherever the model holds them
    (an adapter's ``blocks`` is the wrapped model's own layer list: every module that
    holds that list gets the shorter one). Used by dual-layer profiling."""
    old = model.blocks
    new = nn.ModuleList(list(old)[:depth])
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if child is old:
                setattr(module, name, new)
    if getattr(model, "blocks", None) is old:  # held as a plain attribute
        model.__dict__["blocks"] = new
