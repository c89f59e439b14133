"""Export a trained model in the format it came in (``datacentric export``).

The run folder's newest checkpoint (or the one named) is read in one process, its
shards gathered into full tensors (a run under FSDP2 saved each rank's shard), and
written as:

- a Hugging Face model (``hf:DIR_OR_NAME``): ``save_pretrained`` of the transformers
  model (safetensors weights, ``config.json``), with the tokenizer files the run read
  its text with beside it (its ``--tokenizer`` folder, else the model folder's; none
  for ``--tokenizer bytes``), so ``AutoModelForCausalLM.from_pretrained(OUT)`` loads it
  and ``AutoTokenizer.from_pretrained(OUT)`` gives the ids it was trained on (a LoRA
  run's PEFT adapter folder carries the same tokenizer files);
- a diffusers video transformer (``diffusers:DIR_OR_NAME``): ``save_pretrained`` of
  the diffusers model (safetensors, ``config.json``), which its class's
  ``from_pretrained(OUT)`` loads; trained from a pipeline folder, the pipeline's other
  components and ``model_index.json`` are copied beside ``OUT/transformer``, so the
  pipeline class's ``from_pretrained(OUT)`` loads it with the trained transformer;
- any other model (a preset, ``pkg.module:factory``): ``model.safetensors`` holding
  the model's ``state_dict`` and ``datacentric_model.json`` naming the model and its
  arguments (rebuild it, then ``load_state_dict(safetensors.torch.load_file(...))``).

Parameter names are the wrapped model's own: the adapter's prefix (``hf.``,
``transformer.``) is removed, and so are the names that recomputation or
compilation wrappers insert.

What is trusted (docs/reliability.md, "Trust"): the model is the one the checkpoint's
``trainer.json`` records (its manifest, and ``expect_sha256``, cover it); a
``pkg.module:factory`` runs only when the caller names it (``--model``), never because
the folder does; the checkpoint's tensors must be that model's, by name and shape.
``out`` is never the run folder or a folder holding it, and a non-empty ``out`` is
replaced (``overwrite``) only when an earlier export wrote it: only the files its
``datacentric_export.json`` lists are removed, each only while it holds the content
(SHA-256) export recorded.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datacentric.data.tokenizer_files import BYTES, TEMPLATE_FOLDERS
from datacentric.models.source import (
    DIFFUSERS_PREFIX,
    HF_PREFIX,
    ModelSource,
    build_from_source,
    parse_model_args,
    resolve_model,
    tiny_names,
)
from datacentric.progress import Progress
from datacentric.regular_files import read_json_file, read_regular_bytes
from datacentric.settings.run_settings import record_sections
from datacentric.settings.schema import ConfigError
from datacentric.train.checkpoints.checkpoint_folders import TRAINER_FILE
from datacentric.train.checkpoints.checkpoint_load import read_model_state
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint, verify_checkpoint
from datacentric.train.checkpoints.run_paths import places, start_dir
from datacentric.train.checkpoints.state_names import alias_names, with_aliases, without_aliases
from datacentric.train.exporting.export_folders import (
    EXPORT_RECORD,
    ExportError,
    check_export,
    previous_export,
    remove_previous,
    write_record,
)
from datacentric.train.exporting.lora_export import (
    lora_from_settings,
    merged_state,
    transposed_layers,
    write_adapter,
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
    "vocab.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


#: what ``export --weights-dtype`` may write the weights as (default: as the checkpoint holds them,
#: float32 master weights whatever the model folder's dtype)
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_settings(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The resolved settings a run wrote (``config.json``), by section."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"{run_dir}: no config.json (is it the --out folder of a train run?)")
    return _sections(read_json_file(path, error=ExportError), path)


def _sections(record: dict[str, Any], where: Path) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` of a stored settings record (an earlier release's
    flat keys read too)."""
    try:
        return record_sections(record, str(where))
    except ConfigError as err:
        raise ExportError(f"{err} (is it a train run's?)") from None


def clean_name(name: str) -> str:
    """A parameter name without the segments wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    checkpoint: str | None = None,
    overwrite: bool = False,
    model: str | None = None,
    model_args: list[str] | None = None,
    expect_sha256: str | None = None,
    merge: bool = False,
    dtype: str | None = None,
) -> dict[str, Any]:
    """Write the run's model to ``out_dir`` in its source format; returns a summary
    (format, checkpoint, parameter count, files written).

    ``dtype`` (a :data:`WEIGHT_DTYPES` name): the floating-point weights are written
    cast to it (a transformers ``config.json`` says it too); default: as the checkpoint
    holds them (a run trains float32 master weights, whatever the folder's dtype).

    ``model``/``model_args`` (``--model``, ``--model-arg``) name the model instead of the
    run's record; a ``pkg.module:factory`` runs only when named so. ``expect_sha256``:
    the checkpoint's manifest must have this SHA-256 (checked first). A LoRA run's
    adapters are written alone (:mod:`datacentric.train.exporting.lora_export`), or with ``merge``
    folded into the model, which is then written as a full fine-tune's."""
    run = Path(run_dir)
    out = Path(out_dir)
    named = check_export(
        run, out, checkpoint=checkpoint, overwrite=overwrite, expect_sha256=expect_sha256
    )
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise ExportError(f"--weights-dtype {dtype}: choose one of {', '.join(WEIGHT_DTYPES)}")
    previous = previous_export(run, out, overwrite)
    # the newest checkpoint whose every file verifies (named: whose record does)
    path = named if checkpoint else latest_checkpoint(run, expect_sha256) or named
    with Progress(f"export {path.name}", 4, unit="stage") as bar:
        bar.set_stage("verify the checksums")
        trainer = verify_checkpoint(path, expect_sha256)
        settings = _recorded_settings(run, path, trainer, named=model is not None)
        start = start_dir(run, trainer, settings)
        settings = _paths_as_the_run_saw(settings, start, model)
        source = dataclasses.replace(
            _export_source(run, settings, model, model_args), lora=lora_from_settings(settings)
        )
        bar.update(stage="read the weights")
        state = {clean_name(k): v for k, v in read_model_state(path).items()}
        bar.update(stage="build the model")
        built, _ = build_from_source(source, device="meta")
        _check_fits(built, state, f"{path.name} of {run}", source.name)
        # a transformers model, or its adapter, carries the tokenizer the run read its
        # text with (as transformers' Trainer saves it beside a PEFT adapter): found
        # before anything is written
        tokenizers = _tokenizer_folders(source, settings, start) if source.kind == "hf" else []
        remove_previous(out, previous)
        out.mkdir(parents=True, exist_ok=True)
        bar.update(stage=f"write {out}")
        fmt, parameters = _write_model(built, source, state, out, tokenizers, merge, dtype)
        bar.update()
    files = write_record(out, run, path, fmt)
    summary = {
        "format": fmt,
        "checkpoint": str(path),
        "iterations_done": trainer.get("iterations_done"),
        "parameters": parameters,
        "out": str(out),
        "files": sorted([*files, EXPORT_RECORD]),
    }
    if source.kind == "hf":  # where its tokenizer files came from (None: --tokenizer bytes)
        summary["tokenizer"] = str(tokenizers[0]) if tokenizers else None
    return summary


def _write_model(
    built: nn.Module,
    source: ModelSource,
    state: dict[str, torch.Tensor],
    out: Path,
    tokenizers: list[Path],
    merge: bool,
    dtype: str | None,
) -> tuple[str, int]:
    """Write the model (or a LoRA run's adapters, or with ``merge`` the model they are
    folded into) into ``out``, its weights cast to ``dtype`` (a :data:`WEIGHT_DTYPES`
    name; None: as they are), a transformers model or adapter with the files of
    ``tokenizers`` beside it: its format and how many values it holds."""
    if source.lora is not None and merge:  # --merge: the adapters folded in, a full model's
        built, source, state = _merged_model(built, source, state)
    if source.lora is not None:  # the adapters alone are written (and cast)
        state = {k: v for k, v in state.items() if ".lora_" in k}
    if dtype is not None:  # after a merge: its sums in the checkpoint's precision
        cast = WEIGHT_DTYPES[dtype]
        state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
    if source.lora is not None:
        base = str(source.folder) if source.folder is not None else source.name
        fmt = {"hf": "peft-adapter", "diffusers": "diffusers-lora"}.get(source.kind, "lora")
        transposed = transposed_layers(built)  # GPT-2's Conv1D: fan_in_fan_out
        count = write_adapter(state, built.lora_spec, source.kind, base, out, transposed)
        for folder in tokenizers:  # AutoTokenizer.from_pretrained(OUT): the run's ids
            _copy_tokenizer(folder, out)
        return fmt, count
    if source.kind == "hf":
        return "transformers", _export_hf(built, source, state, out, tokenizers)
    if source.kind == "diffusers":
        return "diffusers", _export_diffusers(built, source, state, out)
    return "safetensors", _export_state(built, source, state, out)


def _merged_model(
    built: nn.Module, source: ModelSource, state: dict[str, torch.Tensor]
) -> tuple[nn.Module, ModelSource, dict[str, torch.Tensor]]:
    """A LoRA run's model with its adapters folded in: the model without LoRA (on the
    meta device), its source and the merged state under its names.

    An adapter on one name of a tied tensor (``lm_head`` of a model whose head is its
    input embedding) changes that name only: a transformers model is written with
    ``tie_word_embeddings`` off, its head the merged one and the embedding unchanged
    (tying them again would drop the update); any other model's tie that the merge
    splits is an :class:`ExportError`."""
    spec = built.lora_spec
    # a tied base under each name; a Conv1D's (GPT-2) update transposed
    merged = merged_state(with_aliases(built, state), spec, transposed_layers(built))
    plain = dataclasses.replace(source, lora=None)
    rebuilt, _ = build_from_source(plain, device="meta")
    split = _split_ties(rebuilt, merged)
    if split and source.kind == "hf":
        plain = dataclasses.replace(plain, args={**plain.args, "tie_word_embeddings": False})
        rebuilt, _ = build_from_source(plain, device="meta")
        split = _split_ties(rebuilt, merged)
    if split:
        alias, primary = split[0]
        raise ExportError(
            f"--merge: {alias} and {primary} are one tensor in {source.name!r}, and the "
            f"LoRA targets ({', '.join(spec.targets or ())}) change {alias} only; export "
            "without --merge (the adapters alone)"
        )
    return rebuilt, plain, without_aliases(rebuilt, merged)


def _split_ties(model: nn.Module, state: dict[str, torch.Tensor]) -> list[tuple[str, str]]:
    """The names ``model`` registers on one tensor whose values in ``state`` differ."""
    return [
        (alias, primary)
        for alias, primary in alias_names(model).items()
        if alias in state and primary in state and not torch.equal(state[alias], state[primary])
    ]


def _recorded_settings(
    run: Path, checkpoint: Path, trainer: dict[str, Any], named: bool
) -> dict[str, Any]:
    """The settings the checkpoint was trained with: its ``trainer.json`` record (which
    its manifest, and a pin, cover), else the run's ``config.json``. Unless the model is
    ``named`` (``--model``), a ``config.json`` naming another model than the checkpoint
    is an :class:`ExportError`."""
    record = trainer.get("config")
    if not isinstance(record, dict):
        return run_settings(run)
    saved = _sections(record, checkpoint / TRAINER_FILE)
    if not named and (run / "config.json").is_file():
        settings = run_settings(run)["model"]
        for key in ("model", "model_args"):
            if key in settings and settings[key] != saved["model"].get(key):
                raise ExportError(
                    f"{run / 'config.json'} says {key} {settings[key]!r}, but "
                    f"{checkpoint / TRAINER_FILE} was trained with "
                    f"{saved['model'].get(key)!r}: the run folder was changed; pass --model "
                    "(and --model-arg) naming the model"
                )
    return saved


def _paths_as_the_run_saw(
    settings: dict[str, Any], start: Path | None, named: str | None
) -> dict[str, Any]:
    """``settings`` with the model folder (unless ``--model`` is ``named``) the run
    recorded as typed, where the run found it: relative to the directory it was started
    in (``start``), else here (:mod:`~datacentric.train.checkpoints.run_paths`)."""
    model = dict(settings["model"])
    recorded = model.get("model")
    for prefix, kind in ((HF_PREFIX, "hf"), (DIFFUSERS_PREFIX, "diffusers")):
        if named is None and isinstance(recorded, str) and recorded.startswith(prefix):
            target = recorded.removeprefix(prefix)
            tiny = target in tiny_names(kind)  # a name, where no folder has it
            found = _as_the_run_saw(target, start, f"model {recorded!r}", tiny)
            model["model"] = prefix + found
    return {**settings, "model": model}


def _as_the_run_saw(typed: str, start: Path | None, what: str, name: bool = False) -> str:
    """The path the run recorded as ``typed``, where it is now: in the directory the run
    was started in, else here; as typed where only here was looked at (what reads it
    says what is missing) or where it may be a ``name`` instead, else
    :class:`ExportError` naming both places."""
    tried = places(typed, start)
    found = next((path for path in tried if path.exists()), None)
    if found is not None:
        return typed if found == Path(typed) else str(found)
    if len(tried) == 1 or name:
        return typed
    raise ExportError(
        f"the run's {what} is neither where the run was started ({tried[0]}) nor here "
        f"({tried[1].absolute()}); export from the folder the run was started in, or put "
        "it back there" + ("; or pass --model naming it" if what.startswith("model") else "")
    )


def _export_source(
    run: Path, settings: dict[str, Any], model: str | None, model_args: list[str] | None
) -> ModelSource:
    """The model to export: ``--model``/``--model-arg`` when given, else the run's record;
    a ``pkg.module:factory`` only the user named is run (never one the folder names)."""
    recorded = settings["model"].get("model")
    if model is None and not isinstance(recorded, str):
        raise ExportError(f"{run}: the run records no model; pass --model naming it")
    args = parse_model_args(model_args) if model_args else settings["model"].get("model_args")
    source = resolve_model(model or recorded, args)
    if source.kind == "factory" and model is None:
        raise ExportError(
            f"{run}: the run's model {recorded!r} is code (pkg.module:factory), and export runs "
            f"no code a run folder names; pass --model {recorded} if it is yours to run"
        )
    return source


def _check_fits(model: nn.Module, state: dict[str, torch.Tensor], where: str, name: str) -> None:
    """The checkpoint's tensors are ``model``'s, by name and shape (:class:`ExportError`
    naming the first differences otherwise)."""
    own = without_aliases(model, model.state_dict())
    want = {clean_name(k): tuple(v.shape) for k, v in own.items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    problems = []
    for label, names in (("lacks", set(want) - set(have)), ("adds", set(have) - set(want))):
        if names:
            shown = sorted(names)
            more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
            problems.append(f"it {label} {', '.join(shown[:3])}{more}")
    reshaped = [k for k in sorted(set(want) & set(have)) if want[k] != have[k]]
    if reshaped:
        k = reshaped[0]
        problems.append(f"{k} is {list(have[k])} in it, {list(want[k])} in the model")
    if problems:
        raise ExportError(
            f"{where} does not hold model {name!r}: {'; '.join(problems)}; pass --model (and "
            "--model-arg) naming the model the run trained"
        )


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
    adapter: nn.Module,
    source: ModelSource,
    state: dict[str, torch.Tensor],
    out: Path,
    tokenizers: list[Path],
) -> int:
    """Write the model as a transformers folder, with the files of the tokenizer folders
    ``tokenizers`` beside it (:func:`_tokenizer_folders`); returns its parameter count."""
    from transformers import AutoModelForCausalLM

    config = adapter.hf.config
    config.use_cache = True  # the exported model is for ordinary use again
    with torch.device("meta"):
        inner = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    _load_into(inner, _strip_prefix(state, "hf."), str(source.name))
    inner.save_pretrained(out)
    for folder in tokenizers:
        _copy_tokenizer(folder, out)
    return _parameter_count(inner)


def _copy_tokenizer(folder: Path, out: Path) -> None:
    """Copy ``folder``'s tokenizer files (:data:`TOKENIZER_FILES`, and the named chat
    templates of ``additional_chat_templates/``, which ``apply_chat_template(...,
    chat_template=NAME)`` reads) into ``out``, keeping what ``out`` already has;
    regular files only, as for the files at the top."""
    names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    for sub in TEMPLATE_FOLDERS:
        if (folder / sub).is_dir():
            templates = (folder / sub).iterdir()
            found = sorted(p.name for p in templates if p.suffix == ".jinja" and p.is_file())
            names += [f"{sub}/{name}" for name in found]
    for name in names:
        if not (out / name).exists():
            (out / name).parent.mkdir(exist_ok=True)
            (out / name).write_bytes(read_regular_bytes(folder / name))


def _tokenizer_folders(
    source: ModelSource, settings: dict[str, Any], start: Path | None = None
) -> list[Path]:
    """The folder of the tokenizer the run read its text with, alone: its
    ``--tokenizer`` (a folder, or a ``tokenizer.json``'s; found where the run was started
    in ``start``, else here), else the model folder's own; none for ``--tokenizer
    bytes``, whose ids are UTF-8 bytes (the model folder's tokenizer, or files of another
    one mixed in, would give the exported model other ids than it was trained on)."""
    tokenizer = (settings.get("data") or {}).get("tokenizer")
    if tokenizer == BYTES:
        return []
    if tokenizer:  # a tokenizer.json file, or a tokenizer folder
        given = Path(_as_the_run_saw(tokenizer, start, f"tokenizer {tokenizer!r}"))
        if not given.exists():  # the export would carry none, or another one's
            raise ExportError(
                f"the run's tokenizer {tokenizer!r} is not there any more: put it back, or "
                "export from the directory the run was started in"
            )
        return [given if given.is_dir() else given.parent]
    return [source.folder] if source.folder is not None else []


def _export_diffusers(
    adapter: nn.Module, source: ModelSource, state: dict[str, torch.Tensor], out: Path
) -> int:
    """Write the model as a diffusers folder; returns its parameter count."""
    from datacentric.models.source import inner_pretrained

    inner = inner_pretrained(adapter)
    if inner is None:
        raise ExportError(f"{source.name}: no diffusers model inside the adapter to export")
    prefix = next(n for n, m in adapter.named_children() if m is inner) + "."
    with torch.device("meta"):
        fresh = type(inner).from_config(inner.config)
    _load_into(fresh, _strip_prefix(state, prefix), str(source.name))
    if source.pipeline is not None:
        _copy_pipeline(source.pipeline, out)
        out = out / "transformer"
    fresh.save_pretrained(out)
    return _parameter_count(fresh)


def _copy_pipeline(pipeline: Path, out: Path) -> None:
    """The pipeline folder's other components and ``model_index.json`` into ``out``
    (the trained transformer is written to ``out/transformer``)."""
    for item in sorted(pipeline.iterdir()):
        if item.name == "transformer":
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name, symlinks=False)
        elif item.is_file():
            shutil.copy2(item, out / item.name)


def _parameter_count(model: torch.nn.Module) -> int:
    """Elements of ``model``'s parameters, each shared or tied tensor once."""
    return sum(int(p.numel()) for p in model.parameters())


def _export_state(
    model: nn.Module, source: ModelSource, state: dict[str, torch.Tensor], out: Path
) -> int:
    """Write the state dict as safetensors; returns its elements, tensors that share
    storage counted once."""
    from safetensors.torch import save_file

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
