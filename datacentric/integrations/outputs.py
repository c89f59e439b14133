"""Where a drop-in trainer's run writes, as a transformers script expects to find it.

``output_dir`` holds, as transformers' ``Trainer`` leaves it:

- ``checkpoint-N``: a link to the run's checkpoint of step N (``run/checkpoints/step-N``),
  so ``transformers.trainer_utils.get_last_checkpoint(output_dir)`` finds the newest and
  ``train(resume_from_checkpoint=...)`` takes it;
- what ``save_model()`` writes (the model, or a LoRA run's adapter, with the tokenizer);
- ``trainer_state.json``, ``*_results.json`` (``save_state``, ``save_metrics``);
- ``run/``: the ``datacentric train`` run folder (settings, metrics, checkpoints, and the
  inputs the drop-in wrote under ``run/inputs``); ``run/trainer_state.json`` keeps the
  ``TrainerState`` a resume restores (its log history, tokens seen and best evaluation so
  far at each checkpoint), what transformers keeps in each checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from datacentric.regular_files import FileFormatError, read_json_file
from datacentric.train.checkpoints.checkpoint_folders import (
    MANIFEST,
    checkpoint_step,
    list_checkpoints,
)
from datacentric.train.exporting.export import EXPORT_RECORD, export_run
from datacentric.train.run_folder import RUN_FILES

RUN = "run"
"""The run folder inside ``output_dir``."""
TRAINED = "trained"
"""The trained model, exported inside the run folder at the end of ``train()``."""
_LINK = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"
"""The ``TrainerState`` at each checkpoint, in the run folder (:func:`keep_state`)."""
BEST = ("best_metric", "best_global_step", "best_model_checkpoint")
"""The ``TrainerState`` fields of the best evaluation so far (``metric_for_best_model``)."""


def run_folder(output_dir: str | Path) -> Path:
    """The ``datacentric train`` run folder of ``output_dir``."""
    return Path(output_dir) / RUN


def earlier_run(output_dir: str | Path) -> str | None:
    """What an earlier run left in ``output_dir`` (a file of its run folder), else None."""
    run = run_folder(output_dir)
    found = [name for name in RUN_FILES if (run / name).exists()]
    return str(run / found[0]) if found else None


def link_checkpoint(output_dir: str | Path, folder: Path) -> None:
    """``output_dir/checkpoint-N`` -> the checkpoint ``folder`` of step N (relative, so
    the folder can move); links whose checkpoint is gone (``keep_last``) are removed."""
    out = Path(output_dir)
    step = checkpoint_step(folder)
    if step is None:
        return
    link = out / f"checkpoint-{step}"
    if link.is_symlink():
        link.unlink()
    if not link.exists():
        link.symlink_to(os.path.relpath(folder, out), target_is_directory=True)
    for other in out.iterdir():
        if _LINK.match(other.name) and other.is_symlink() and not other.exists():
            other.unlink()


def keep_state(
    output_dir: str | Path,
    step: int,
    tokens: int,
    log_history: list[dict],
    best: dict[str, Any] | None = None,
) -> None:
    """Keep what a resume from the checkpoint of ``step`` restores of the ``TrainerState``
    (as transformers saves it into each checkpoint): its log history up to ``step``, the
    tokens seen by then and the best so far (``best_metric``, ``best_global_step``,
    ``best_model_checkpoint``), beside the other checkpoints' (rank 0)."""
    path = run_folder(output_dir) / STATE
    kept = _kept(output_dir)
    record = {
        "num_input_tokens_seen": {**kept["num_input_tokens_seen"], str(step): tokens},
        "log_history": [r for r in log_history if r.get("step", 0) <= step],
        "best": {**kept["best"], str(step): dict.fromkeys(BEST) | (best or {})},
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(path)


def kept_state(output_dir: str | Path, step: int) -> tuple[list[dict], int, dict] | None:
    """``(log history, tokens seen, best so far)`` at the checkpoint of ``step``
    (:func:`keep_state`; the best: ``{field: value}`` of :data:`BEST`, all None when none
    was kept); None when nothing was kept for it."""
    kept = _kept(output_dir)
    tokens = kept["num_input_tokens_seen"].get(str(step))
    if tokens is None:
        return None
    best = kept["best"].get(str(step)) or dict.fromkeys(BEST)
    return [r for r in kept["log_history"] if r.get("step", 0) <= step], tokens, best


def _kept(output_dir: str | Path) -> dict[str, Any]:
    """``run/trainer_state.json`` as :func:`keep_state` writes it (empty where there is
    none); a file of another form is :class:`FileFormatError` naming it and how to go
    on."""
    path = run_folder(output_dir) / STATE
    if not path.exists():
        return {"num_input_tokens_seen": {}, "log_history": [], "best": {}}
    kept = read_json_file(path)
    tokens, history = kept.get("num_input_tokens_seen"), kept.get("log_history")
    best = kept.get("best", {})
    if not (
        isinstance(tokens, dict)
        and all(_whole(count) for count in tokens.values())
        and isinstance(history, list)
        and all(isinstance(log, dict) and _number(log.get("step", 0)) for log in history)
        and isinstance(best, dict)
        and all(_best_record(record) for record in best.values())
    ):
        raise FileFormatError(
            f"{path}: not the trainer state the drop-in trainers keep (num_input_tokens_seen: "
            "a count per checkpoint step; log_history: a list of logs, each with a numeric "
            "step; best: per checkpoint step, best_metric, best_global_step and "
            "best_model_checkpoint); remove it to resume without the earlier log history"
        )
    return {"num_input_tokens_seen": tokens, "log_history": history, "best": best}


def _best_record(record: Any) -> bool:
    """Whether ``record`` is a best-so-far as :func:`keep_state` keeps it."""
    if not isinstance(record, dict) or set(record) != set(BEST):
        return False
    metric, step, folder = (record[name] for name in BEST)
    return (
        (metric is None or _number(metric))
        and (step is None or _whole(step))
        and (folder is None or isinstance(folder, str))
    )


def checkpoint_of(output_dir: str | Path, step: int) -> Path | None:
    """The run's checkpoint folder of ``step`` (None: none was kept)."""
    found = [p for p in list_checkpoints(run_folder(output_dir)) if checkpoint_step(p) == step]
    return found[-1] if found else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def resume_spec(value: Any, output_dir: str | Path) -> tuple[bool, str | None]:
    """``train(resume_from_checkpoint=value)`` as the ``[checkpoint]`` section's
    ``(resume, resume_from)``; ValueError naming the argument when it names no
    checkpoint."""
    if value is None or value is False:
        return False, None
    if value is True:
        # transformers raises here too; a run that stopped before its first save restarts
        if not list_checkpoints(run_folder(output_dir)) and earlier_run(output_dir) is None:
            foreign = foreign_checkpoints(output_dir)
            raise ValueError(
                f"resume_from_checkpoint=True: no checkpoint of a datacentric run in "
                f"output_dir {output_dir}"
                + (
                    f" ({', '.join(foreign)}: not a drop-in run's); start a new run in "
                    "another output_dir"
                    if foreign
                    else "; train without it to start a new run"
                )
            )
        return True, None
    if not isinstance(value, str | os.PathLike):
        raise ValueError(
            f"resume_from_checkpoint={value!r}: give True (the newest checkpoint of "
            "output_dir) or a checkpoint folder"
        )
    path = Path(value)
    if not path.is_dir():
        raise ValueError(
            f"resume_from_checkpoint={str(value)!r}: no such checkpoint folder; give True "
            f"(the newest checkpoint of {output_dir}) or one of its checkpoint-N folders"
        )
    if not (path / MANIFEST).is_file() and (path / "trainer_state.json").is_file():
        raise ValueError(
            f"resume_from_checkpoint={str(value)!r}: a checkpoint of transformers' own "
            "Trainer; the drop-in resumes only its own checkpoint-N (with its optimizer and "
            "data position): train without it to start a new run"
        )
    run = run_folder(output_dir).resolve()
    if run not in path.resolve().parents:  # the run's settings name its own inputs
        raise ValueError(
            f"resume_from_checkpoint={str(value)!r}: not a checkpoint of output_dir "
            f"{output_dir}; the drop-in resumes a run in its own output_dir (set output_dir "
            "to the one that holds the checkpoint)"
        )
    return False, str(path.resolve())


def foreign_checkpoints(output_dir: str | Path) -> list[str]:
    """The ``checkpoint-N`` folders of ``output_dir`` that are neither links to a run's
    checkpoint nor copies of one (transformers' own ``Trainer`` writes such folders)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    return sorted(
        p.name
        for p in out.iterdir()
        if _LINK.match(p.name) and not p.is_symlink() and not (p / MANIFEST).is_file()
    )


def export_trained(run: Path, checkpoint: Path) -> Path:
    """The model (a LoRA run: its adapter) of ``checkpoint``, written to ``run/trained``."""
    folder = run / TRAINED
    export_run(run, folder, checkpoint=str(checkpoint), overwrite=True)
    return folder


def copy_saved(trained: Path, out: Path, tokenizer: Any) -> None:
    """The exported files of ``trained`` and the tokenizer's into ``out`` (files of the
    same name replaced, nothing else touched), as TRL's ``save_model`` leaves it."""
    if out.resolve() == run_folder(out).resolve() or out.resolve() == trained.resolve():
        raise ValueError(f"save_model({str(out)!r}): that is the run's own folder")
    out.mkdir(parents=True, exist_ok=True)
    for path in trained.iterdir():
        if path.is_file() and path.name != EXPORT_RECORD:
            shutil.copyfile(path, out / path.name)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def save_base(model: Any, folder: Path) -> None:
    """``model.save_pretrained(folder)``; of a ``PeftModel``, its base model's weights
    without the adapter's layers (the weights LoRA starts from)."""
    if not getattr(model, "peft_config", None):
        model.save_pretrained(folder)
        return
    base = model.get_base_model()
    state = {
        name.replace(".base_layer.", "."): tensor
        for name, tensor in base.state_dict().items()
        if ".lora_" not in name
    }
    base.save_pretrained(folder, state_dict=state)


def load_trained(trained: Path, base: Any, base_folder: Path, lora: bool) -> Any:
    """The trained model as transformers and peft load it: a ``PeftModel`` over ``base``
    for a LoRA run (``base`` itself, a ``PeftModel`` already, with the trained adapter),
    else ``base`` (a model object) with the trained weights, or the trained model loaded
    from ``trained`` when ``base`` is a folder name."""
    from transformers import AutoModelForCausalLM

    if lora and getattr(base, "peft_config", None):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        loaded = set_peft_model_state_dict(base, load_peft_weights(str(trained)))
        if loaded.unexpected_keys:
            raise ValueError(
                f"{trained}: adapter tensors the model has not: {loaded.unexpected_keys[:3]}"
            )
        return base
    if lora:
        from peft import PeftModel

        if isinstance(base, str | os.PathLike):
            base = AutoModelForCausalLM.from_pretrained(base_folder)
        return PeftModel.from_pretrained(base, trained, is_trainable=True)
    model = AutoModelForCausalLM.from_pretrained(trained)
    if isinstance(base, str | os.PathLike):
        return model
    base.load_state_dict(model.state_dict())
    return base
