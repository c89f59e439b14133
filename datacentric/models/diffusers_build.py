"""Build a diffusers video transformer for training, and export it back.

- :func:`build_diffusers_model` takes a tiny name (a family's ``tiny``, random
  weights for tests and ``datacentric equivalence``) or a local folder: ``config.json``
  with weights loads them with ``from_pretrained`` (local files only, nothing
  downloaded); ``config.json`` alone builds random weights with ``from_config``. It
  returns the model under our contract (:class:`~.diffusers_generic.DiffusersVideoTransformer`),
  after checking the class and config first (a refused model is never built).
- :func:`export_diffusers` writes the trained diffusers model with ``save_pretrained``
  (safetensors): the folder ``from_pretrained`` loads.

Weights drawn at random come from the global torch RNG: seed it for the same model on
every rank.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.models.attention import AttentionFn, varlen_attention
from datacentric.models.diffusers_families import (
    FAMILIES,
    Family,
    FamilyView,
    family_named,
    family_of_tiny,
)
from datacentric.models.diffusers_generic import DiffusersVideoTransformer
from datacentric.models.diffusers_plan import UnsupportedVideoModel, check_supported
from datacentric.models.model_args import ModelSource, check_loaded_weights
from datacentric.regular_files import read_json_file

try:
    import diffusers
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "datacentric.models.diffusers_build needs diffusers: pip install 'datacentric[video]'"
    ) from _error

TINY_DIFFUSERS: Mapping[str, tuple[str, dict[str, Any]]] = FamilyView(
    lambda family: (family.tiny, (family.transformer, family.tiny_config)) if family.tiny else None
)
"""Tiny names: (diffusers class, random-weight config), a view of the families' ``tiny``
and ``tiny_config`` (:mod:`~.diffusers_families`). ``wan``, ``ltx``, ``skyreels-v2``,
``cogvideox``, ``hunyuan-video``, ``flux`` (4 latent channels; Flux's tokens pack
2 x 2 of them), ``chronoedit`` and ``helios`` (its own 40 blocks, 2 heads of 16) train;
``ltx2`` is refused (its forward needs audio latents)."""

WEIGHT_SUFFIXES = (".safetensors", ".bin")


def tiny_names() -> list[str]:
    """The tiny names the declared families give, in declaration order."""
    return [f.tiny for f in FAMILIES.values() if f.tiny is not None]


def text_width(config: Any) -> int:
    """Width of the text embeddings the model takes (Wan: ``text_dim``; LTX:
    ``caption_channels``; CogVideoX, HunyuanVideo: ``text_embed_dim``; Flux:
    ``joint_attention_dim``)."""
    fields = ("text_dim", "caption_channels", "text_embed_dim", "joint_attention_dim")
    for field in (*fields, "cross_attention_dim"):
        if config.get(field):
            return int(config.get(field))
    raise UnsupportedVideoModel("the config names no text width (text_dim, caption_channels)")


def _declared_class(name: str, where: str) -> tuple[type, Family | None]:
    """The diffusers class ``name`` and its family's declaration, looked up once by the
    class's name (the one key of :data:`FAMILIES`): the family's own class where it
    declares one, else diffusers' class of that name."""
    family = family_named(name)
    cls = family.model_class if family is not None else None
    cls = cls or getattr(diffusers, name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise UnsupportedVideoModel(
            f"{where}: diffusers {diffusers.__version__} has no model {name}"
        )
    return cls, family


def read_model_config(
    config_file: Path, name_or_path: str, overrides: dict[str, Any]
) -> tuple[type, dict[str, Any]]:
    """The class and the config of a model folder's ``config.json``, checked for the
    generic path with ``overrides`` (nothing is built): one line naming the file else."""
    where = f"diffusers:{name_or_path}"
    config = read_json_file(config_file, error=UnsupportedVideoModel)
    name = config.get("_class_name")
    if not isinstance(name, str):
        raise UnsupportedVideoModel(
            f"{where}: {config_file}: _class_name is {str(name)[:80]!r}, not a class name"
        )
    cls, family = _declared_class(name, where)
    try:
        check_supported(cls, {**config, **overrides}, family=family)
    except UnsupportedVideoModel as err:
        raise UnsupportedVideoModel(f"{config_file}: {err}") from None
    except (TypeError, ValueError, AttributeError, LookupError) as err:
        raise UnsupportedVideoModel(
            f"{config_file}: a value of another kind than {name} takes ({err})"
        ) from None
    return cls, config


def build_diffusers_model(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    attention: AttentionFn = varlen_attention,
    device: torch.device | str | None = None,
    **config_overrides: Any,
) -> DiffusersVideoTransformer:
    """A diffusers video transformer under our model contract.

    ``name_or_path``: a folder with ``config.json`` (its ``_class_name`` says the class)
    and, optionally, weights (``*.safetensors``/``*.bin``, sharded or not), else a tiny
    name (:func:`tiny_names`): a folder comes first, as
    :func:`~datacentric.models.source.resolve_model` reads a ``diffusers:`` string.
    ``config_overrides`` replace config fields. Raises :class:`UnsupportedVideoModel` for
    a model the generic path cannot train and ``ValueError`` for a name that is neither.
    """
    folder = Path(name_or_path).expanduser()
    config_file = folder / "config.json"
    if config_file.is_file():  # a folder, before a tiny name (as resolve_model reads it)
        cls, config = read_model_config(config_file, name_or_path, config_overrides)
        weights = [p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES)]
        if weights:
            transformer, loading = cls.from_pretrained(
                folder,
                local_files_only=True,
                torch_dtype=dtype,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported below, naming the tensor
                **config_overrides,
            )
            check_loaded_weights(f"diffusers:{name_or_path}", folder, cls.__name__, loading)
        else:
            transformer = cls.from_config({**config, **config_overrides})
    else:  # a tiny name: its family's tiny config, the class looked up as a folder's is
        tiny = family_of_tiny(name_or_path)
        if tiny is None:
            raise ValueError(
                f"diffusers:{name_or_path}: neither a tiny name ({', '.join(tiny_names())}) "
                "nor a folder with config.json"
            )
        cls, family = _declared_class(tiny.transformer, f"diffusers:{name_or_path}")
        config = {**tiny.tiny_config, **config_overrides}
        # unset fields take the class defaults (None for images)
        check_supported(cls, config, family=family)
        transformer = cls.from_config(config)
    model = DiffusersVideoTransformer(transformer, attention=attention)
    return model.to(device=device, dtype=dtype)


def build_diffusers_source(
    source: ModelSource, *, dtype: torch.dtype, device: Any
) -> DiffusersVideoTransformer:
    """The model a ``diffusers:`` source names (:func:`build_diffusers_model` of its
    tiny name or folder); on the ``meta`` device from the folder's config alone, no
    weights read."""
    if str(device) == "meta" and source.folder is not None:
        # the config alone (no weights read): a folder holding only its config.json
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy2(source.folder / "config.json", Path(scratch) / "config.json")
            with torch.device(device):
                return build_diffusers_model(scratch, dtype=dtype, **source.args)
    target = str(source.folder) if source.folder is not None else source.target
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return build_diffusers_model(target, dtype=dtype, **source.args)


def diffusers_model_of(model: nn.Module) -> nn.Module:
    """The diffusers model inside ``model`` (our adapter, or a DDP wrapper of it)."""
    inner = getattr(model, "module", model)  # DDP keeps the module as .module
    transformer = getattr(inner, "transformer", inner)
    if not hasattr(transformer, "save_pretrained"):
        raise ValueError(f"{type(model).__name__} holds no diffusers model")
    return transformer


def export_diffusers(
    model: nn.Module,
    out_dir: str | Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the diffusers model of ``model`` to ``out_dir`` with ``save_pretrained``
    (safetensors): ``config.json`` and the weights, loadable by the class's
    ``from_pretrained``. ``state_dict`` (full tensors, names with or without the
    adapter's ``transformer.`` prefix, e.g. gathered from FSDP2 shards) replaces the
    model's own weights in the export."""
    transformer = diffusers_model_of(model)
    if state_dict is not None:
        prefix = "transformer."
        if any(k.startswith(prefix) for k in state_dict):
            state_dict = {k: v for k, v in state_dict.items() if k.startswith(prefix)}
        weights = {k.removeprefix(prefix): v for k, v in state_dict.items()}
        copy = type(transformer).from_config(transformer.config)
        copy.load_state_dict(weights, strict=True)
        transformer = copy
    out = Path(out_dir)
    transformer.save_pretrained(out, safe_serialization=True)
    return out
