"""Export a trained model in the format it came in (``datacentric export``).

The run folder's newest checkpoint (or the one named) is read in one process, its
shards gathered into full tensors (a run under FSDP2 saved each rank's shard), and
written as:

- a Hugging Face model (``hf:DIR_OR_NAME``): ``save_pretrained`` of the transformers
  model (safetensors weights, ``config.json``), with the tokenizer files of the run's
  ``--tokenizer`` folder beside it, so ``AutoModelForCausalLM.from_pretrained(OUT)``
  loads it;
- a diffusers video transformer (``diffusers:DIR_OR_NAME``): ``save_pretrained`` of
  the diffusers model (safetensors, ``config.json``), which its class's
  ``from_pretrained(OUT)`` loads;
- any other model (a preset, ``pkg.module:factory``): ``model.safetensors`` holding
  the model's ``state_dict`` and ``datacentric_model.json`` naming the model and its
  arguments (rebuild it, then ``load_state_dict(safetensors.torch.load_file(...))``).

Parameter names are the wrapped model's own: the adapter's prefix (``hf.``,
``transformer.``) is removed, and so are the names that recomputation or
compilation wrappers insert.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from datacentric.models.source import ModelSource, parse_model_args, resolve_model
from datacentric.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    read_model_state,
    resolve_resume_from,
    verify_checkpoint,
)

#: path segments that wrappers insert into parameter names (activation checkpointing,
#: torch.compile); they are not the model's own
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module", "module")
#: tokenizer files copied next to an exported Hugging Face model
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class ExportError(ValueError):
    """A run folder that cannot be exported, or an output folder we must not replace."""


def run_settings(run_dir: Path) -> dict[str, Any]:
    """The resolved settings a run wrote (``config.json``)."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"{run_dir}: no config.json (is it the --out folder of a train run?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ExportError(f"{path} is corrupt: {err}") from None


def clean_name(name: str) -> str:
    """A parameter name without the segments wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    checkpoint: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write the run's model to ``out_dir`` in its source format; returns a summary
    (format, checkpoint, parameter count, files written)."""
    run = Path(run_dir)
    out = Path(out_dir)
    if not run.is_dir():
        raise ExportError(f"{run}: no such run folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; choose a new --out or pass --overwrite")
    settings = run_settings(run)
    path = resolve_resume_from(run, checkpoint) if checkpoint else latest_checkpoint(run)
    if path is None:
        raise CheckpointError(f"{run}: no checkpoint to export (train with --out first)")
    trainer = verify_checkpoint(path)
    state = {clean_name(k): v for k, v in read_model_state(path).items()}
    source = resolve_model(settings["model"], parse_model_args(settings.get("model_args")))
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if source.kind == "hf":
        fmt = "transformers"
        parameters = _export_hf(source, state, out, settings)
    elif source.kind == "diffusers":
        fmt = "diffusers"
        parameters = _export_diffusers(source, state, out)
    else:
        fmt = "safetensors"
        parameters = _export_state(source, state, out)
    return {
        "format": fmt,
        "checkpoint": str(path),
        "iterations_done": trainer.get("iterations_done"),
        "parameters": parameters,
        "out": str(out),
        "files": sorted(p.name for p in out.iterdir()),
    }


def _strip_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    if not inner:
        raise ExportError(f"the checkpoint holds no parameters under {prefix!r}")
    return inner


def _load_into(inner: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load ``state`` into ``inner`` (built on the meta device), every tensor assigned."""
    missing, unexpected = inner.load_state_dict(state, strict=False, assign=True)
    if unexpected:
        raise ExportError(
            f"{what}: the checkpoint holds parameters the model lacks: {unexpected[:3]}"
        )
    tie = getattr(inner, "tie_weights", None)
    if callable(tie):
        tie()
    still_meta = [n for n, p in inner.named_parameters() if p.is_meta]
    if still_meta:
        raise ExportError(f"{what}: the checkpoint lacks parameters {still_meta[:3]}")
    del missing  # tied parameters are restored by tie_weights above


def _export_hf(
    source: ModelSource, state: dict[str, torch.Tensor], out: Path, settings: dict[str, Any]
) -> int:
    """Write the model as a transformers folder; returns its parameter count."""
    from transformers import AutoModelForCausalLM

    from datacentric.models.source import build_from_source

    adapter, _ = build_from_source(source, device="meta")
    config = adapter.hf.config
    config.use_cache = True  # the exported model is for ordinary use again
    with torch.device("meta"):
        inner = AutoModelForCausalLM.from_config(config)
    _load_into(inner, _strip_prefix(state, "hf."), str(source.name))
    inner.save_pretrained(out)
    for folder in _tokenizer_folders(source, settings):
        for name in TOKENIZER_FILES:
            if (folder / name).is_file() and not (out / name).exists():
                shutil.copy2(folder / name, out / name)
    return _parameter_count(inner)


def _tokenizer_folders(source: ModelSource, settings: dict[str, Any]) -> list[Path]:
    folders = []
    if settings.get("tokenizer"):
        folders.append(Path(settings["tokenizer"]).parent)
    if source.folder is not None:
        folders.append(source.folder)
    return folders


def _export_diffusers(source: ModelSource, state: dict[str, torch.Tensor], out: Path) -> int:
    """Write the model as a diffusers folder; returns its parameter count."""
    from datacentric.models.source import build_from_source, inner_pretrained

    adapter, _ = build_from_source(source, device="meta")
    inner = inner_pretrained(adapter)
    if inner is None:
        raise ExportError(f"{source.name}: no diffusers model inside the adapter to export")
    prefix = next(n for n, m in adapter.named_children() if m is inner) + "."
    with torch.device("meta"):
        fresh = type(inner).from_config(inner.config)
    _load_into(fresh, _strip_prefix(state, prefix), str(source.name))
    fresh.save_pretrained(out)
    return _parameter_count(fresh)


def _parameter_count(model: torch.nn.Module) -> int:
    """Elements of ``model``'s parameters, each shared or tied tensor once."""
    return sum(int(p.numel()) for p in model.parameters())


def _export_state(source: ModelSource, state: dict[str, torch.Tensor], out: Path) -> int:
    """Write the state dict as safetensors; returns its elements, tensors that share
    storage counted once."""
    from safetensors.torch import save_file

    from datacentric.models.source import build_from_source
    from datacentric.train.state_names import with_aliases

    model, _ = build_from_source(source, device="meta")
    state = with_aliases(model, state)  # the names the model's own state dict has
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    # safetensors stores no two names for one storage: keep the first name of each
    seen: dict[int, str] = {}
    distinct = 0
    for name in list(tensors):
        key = tensors[name].untyped_storage().data_ptr()
        if key in seen and tensors[name].numel():
            tensors[name] = tensors[name].clone()
        else:
            distinct += int(tensors[name].numel())
        seen.setdefault(key, name)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "datacentric_model.json").write_text(
        json.dumps({"model": source.name, "model_args": dict(source.args)}, indent=1) + "\n",
        encoding="utf-8",
    )
    return distinct
