"""What a resume loads, checks and keeps: the checkpoint a start continues from
(:func:`load_to_resume`), the settings its run must share with the run that continues
it, the dataset's fingerprint, the trainer's state a checkpoint records
(``trainer.json``), and the records of steps that will run again.

A resume refuses a checkpoint whose model, adapters, data (its draws included),
schedule or seed differ (:data:`RESUME_FIXED`, :func:`check_unchanged`); the rest
(steps, learning rate, checkpointing, world size...) may change. Steps after the
checkpoint run again, so their lines of ``metrics.jsonl`` and ``samples.jsonl`` go
(:func:`keep_records_below`). A run given no global batch trains the default of the
world it started on, which its checkpoints record (``global_batch_tokens``): a resume
on another world keeps it (:func:`global_batch_to_train`), and a resume that gives
another batch is refused as any changed setting.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from datacentric.data.sources import SOURCE_KINDS, source_kind
from datacentric.data.tokenizer_files import BYTES
from datacentric.models.source import DIFFUSERS_PREFIX, HF_PREFIX
from datacentric.parallel.launch import launch_mode
from datacentric.regular_files import check_regular
from datacentric.scheduling.global_batches import (
    GlobalBatchSize,
    run_global_batch,
    size_global_batch,
)
from datacentric.scheduling.resume import Position, kept_batch_shortfall, kept_global_batch
from datacentric.settings import SECTIONS, ConfigError
from datacentric.settings.run_settings import record_sections
from datacentric.settings.scheduling import OLDER_NAMES, SchedulingConfig
from datacentric.settings.sections import (
    CheckpointConfig,
    JobConfig,
    TrainingConfig,
    split_fraction,
)
from datacentric.shapes import SampleShape
from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
from datacentric.train.checkpoints.checkpoint_load import load_checkpoint
from datacentric.train.checkpoints.checkpoint_verify import read_trainer_record
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints
from datacentric.train.checkpoints.run_paths import found_place, start_dir
from datacentric.train.reporting.metrics import read_jsonl

#: ``[training]`` settings of a latent dataset's draws (each sample's caption dropped or
#: kept, its timestep and noise: ``data/diffusion_draws``): the sample stream.
DRAW_SETTINGS = ("caption_dropout", "timestep_sampling", "logit_mean", "logit_std", "flow_shift")

#: Settings a resume must keep (the sample stream and the trained function depend on
#: them: the model, its LoRA adapters, the data and its draws, the schedule, the seed);
#: the rest (steps, learning rate, checkpointing, world size...) may change.
RESUME_FIXED = (
    *((s, f.name) for s in ("model", "lora", "data", "scheduling") for f in fields(SECTIONS[s])),
    *(("training", name) for name in DRAW_SETTINGS),
    ("job", "seed"),
)

#: The trainer record's key of the global batch (tokens) the run trains, the default
#: included (:func:`~datacentric.scheduling.resume.batch_tokens_to_record`).
BATCH_RECORD = "global_batch_tokens"

#: The run folder's records of steps, one line per step (``iteration`` from 0).
STEP_RECORDS = ("metrics.jsonl", "samples.jsonl")


def load_to_resume(
    checkpoints: RunCheckpoints,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    settings: dict[str, dict[str, Any]],
    shapes: list[SampleShape],
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint this start continues from (``resume``, ``resume_from``, or a
    torchrun restart: always the last one), loaded into ``model`` and ``optimizer``
    (collective), and its trainer state; None: a fresh start. The step records are
    checked first, and a checkpoint of other settings (:func:`check_unchanged`: the
    model's included) is refused before anything is loaded."""
    restarted = launch_mode().restarts > 0
    check_step_records(checkpoints.out)  # before anything is loaded
    path = checkpoints.to_load(restarted)
    if path is None:
        return None
    state = load_checkpoint(
        path,
        model,
        optimizer,
        expect_sha256=checkpoints.expected_sha256(restarted),
        check=lambda saved: check_unchanged(path, saved, settings, dataset_fingerprint(shapes)),
    )
    return path, state


def check_resumable(
    checkpoint: CheckpointConfig,
    out: Path,
    settings: dict[str, dict[str, Any]],
    shapes: list[SampleShape],
) -> None:
    """Before the ranks start: the checkpoint a resume (the ``[checkpoint]`` section, of
    the run folder ``out``) would load refuses the same changes of ``settings`` (as the
    ranks record them: ``TrainConfig.to_json()``) as there (:func:`check_unchanged`,
    :class:`CheckpointError`), naming each, so a refused resume starts no rank. Only
    its record is read, checked against the manifest (and the pin): the checkpoint's
    other files are verified by the ranks as they load it. Nothing is checked for a
    fresh start."""
    found = record_to_resume(checkpoint, out)
    if found is not None:
        check_unchanged(*found, settings, dataset_fingerprint(shapes))


def record_to_resume(checkpoint: CheckpointConfig, out: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint a start (the ``[checkpoint]`` section, of the run folder ``out``)
    would load and its trainer record, read alone and checked against the manifest (and
    the pin); None: a fresh start."""
    restarted = launch_mode().restarts > 0
    checkpoints = RunCheckpoints(checkpoint, out, is_main=False)
    path = checkpoints.to_load(restarted, verify=read_trainer_record)  # its record alone
    if path is None:
        return None
    return path, read_trainer_record(path, checkpoints.expected_sha256(restarted))


def global_batch_to_train(
    scheduling: SchedulingConfig,
    training: TrainingConfig,
    job: JobConfig,
    checkpoint: CheckpointConfig,
    shapes: list[SampleShape],
    sp_sizes: list[int],
    world_size: int,
) -> GlobalBatchSize:
    """The global-batch step of a start on ``world_size`` ranks
    (:func:`~datacentric.scheduling.global_batches.run_global_batch`), except on a resume
    whose settings give no batch from a checkpoint that recorded the one its run trained
    (:data:`BATCH_RECORD`): that batch, checked on this world as a given one is, with a
    note where this world's default differs
    (:func:`~datacentric.scheduling.resume.kept_global_batch`). The check before the
    ranks start runs it, and the ranks record the batch in their settings, so the
    resumed steps are the uninterrupted run's on any world (a trainer started without
    the check keeps it at its resume: ``TrainerSaves._keep_global_batch``)."""
    seed = job.seed
    recorded, state = None, {}
    if scheduling.global_batch_tokens is None and scheduling.global_batch_samples is None:
        found = record_to_resume(checkpoint, Path(job.out))
        state = found[1] if found is not None else {}
        recorded = state.get(BATCH_RECORD)
    kept = kept_global_batch(scheduling, recorded, shapes, world_size)
    if kept is None or _sized_here(scheduling, shapes, sp_sizes, world_size) == kept.tokens:
        return run_global_batch(scheduling, training, seed, shapes, sp_sizes, world_size)
    where = (shapes, sp_sizes, world_size, state.get("world_size"))
    check_kept_batch(kept, scheduling, training, seed, *where)
    return kept


def _sized_here(
    scheduling: SchedulingConfig, shapes: list[SampleShape], sp_sizes: list[int], world_size: int
) -> int | None:
    """The global batch (tokens) a start on ``world_size`` ranks sizes from the samples
    where ``scheduling`` gives none (a small dataset's:
    :func:`~datacentric.scheduling.global_batches.size_global_batch`); ``None``: the
    default. Why: the recorded batch of a run that sized it is that batch, which this
    world sizes alike (from the samples alone), and then the start's own note says what
    was sized, not that a default was kept."""
    tokens = [shape.tokens for shape in shapes]
    largest = max(sp_sizes, default=1)
    return size_global_batch(scheduling, tokens, world_size=world_size, largest_sp=largest).tokens


def check_kept_batch(
    kept: GlobalBatchSize,
    scheduling: SchedulingConfig,
    training: TrainingConfig,
    seed: int,
    shapes: list[SampleShape],
    sp_sizes: list[int],
    world_size: int,
    saved_world: int | None,
) -> None:
    """Check the global batch a resume keeps (``kept``: the one the checkpoint, saved on
    ``saved_world`` ranks, recorded) on ``world_size`` ranks as a given one is
    (:func:`~datacentric.scheduling.resume.kept_batch_shortfall`, which a user's loop's
    ``load_state_dict`` shares). Where a step of it holds fewer samples than this world's
    groups need, ``ValueError`` in one line naming the batch, the world and a fix that
    works: fewer ranks (the run's own), or a new run."""
    where = {"sp_sizes": sp_sizes, "world_size": world_size, "seed": seed}
    runs = {"epochs": training.epochs, "iterations": training.iterations}
    short = kept_batch_shortfall(kept, scheduling, shapes, **where, **runs)
    if short is None:
        return
    fewer = f"--world {saved_world}, as it was saved" if saved_world else "--world"
    raise ValueError(
        f"--world {world_size}: the resumed run trains a global batch of {kept.tokens:,} "
        "tokens (the default of the world it started on, kept so that its steps stay those "
        f"of the uninterrupted run; another is refused), and {short}; resume on fewer ranks "
        f"({fewer}), or start a new run (another --out or --overwrite)"
    )


def dataset_fingerprint(shapes: list[SampleShape]) -> str:
    """SHA-256 of the dataset's sample shapes, in order."""
    return hashlib.sha256(repr(list(shapes)).encode()).hexdigest()


def check_unchanged(
    path: Path, state: dict[str, Any], settings: dict[str, dict[str, Any]], fingerprint: str
) -> None:
    """Refuse a resume whose data, model or schedule settings differ from the
    checkpoint's (any world size), naming each changed setting: ``state`` is the
    checkpoint's trainer state, ``settings`` the run's as ``config.json`` holds them and
    ``fingerprint`` its dataset's (:func:`dataset_fingerprint`). A setting that names a
    file or folder (:func:`typed_path`) typed otherwise is unchanged when it names the
    same place, each relative to the directory its run was started in (the checkpoint
    records it): the same data typed from another directory. The same words are the
    same setting wherever they now point, as a project moved or mounted elsewhere
    resumes; another file's samples change the dataset's fingerprint."""
    try:
        saved = _resolve_aliases(record_sections(state.get("config") or {}, str(path)))
    except ConfigError as err:
        raise CheckpointError(str(err)) from None
    recorded = state.get(BATCH_RECORD)  # where a side gives no batch: the one it keeps
    saved = _batch_trained(saved, recorded)
    now = _batch_trained(_resolve_aliases(settings), recorded)
    then = start_dir(path.parent.parent, state, saved)  # the run folder holds checkpoints/
    changed = [
        f"{section}.{name} ({saved[section][name]!r} -> {now[section][name]!r})"
        for section, name in RESUME_FIXED
        if name in saved[section]
        and _as_json(saved[section][name]) != _as_json(now[section][name])
        and not _same_place(section, name, saved[section][name], then, now[section][name])
    ]
    changed += _held_out_change(saved.get("validation", {}), now.get("validation", {}))
    saved_fingerprint = state.get("dataset_fingerprint")
    if saved_fingerprint is not None and saved_fingerprint != fingerprint:
        changed.append("the dataset's samples")
    if changed:
        raise CheckpointError(
            f"cannot resume from {path}: changed since it was saved: {', '.join(changed)}; "
            "resume with the same settings, or start a new run (another --out or --overwrite)"
        )


def _held_out_change(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``validation.dataset`` with both values where the share of the training set it
    holds out differs (``split=FRACTION``, or a split given or dropped: the training
    samples change); another held-out dataset changes no training sample."""
    was, new = saved.get("dataset"), now.get("dataset")
    try:
        same = split_fraction(was) == split_fraction(new)
    except ValueError:  # not a fraction the settings check passes: compare the words
        same = was == new
    return [] if same else [f"validation.dataset ({was!r} -> {new!r})"]


def typed_path(section: str, name: str, value: Any) -> tuple[str, str] | None:
    """The kind and the path of a setting that names a file or folder, as typed: a model
    folder (``hf:DIR``, ``diffusers:DIR``), a dataset's files (``jsonl:GLOB``...), a
    tokenizer other than ``bytes``, a bucket table; None for any other setting or value."""
    if not isinstance(value, str) or not value:
        return None
    if (section, name) == ("model", "model"):
        prefix = next((p for p in (HF_PREFIX, DIFFUSERS_PREFIX) if value.startswith(p)), None)
        return None if prefix is None else (prefix, value.removeprefix(prefix))
    if (section, name) == ("data", "dataset"):
        kind = source_kind(value)
        return (f"{kind}:", value.partition(":")[2]) if kind in SOURCE_KINDS else None
    if (section, name) == ("data", "tokenizer"):
        return None if value == BYTES else ("", value)
    return ("", value) if (section, name) == ("data", "bucket_config") else None


def _same_place(section: str, name: str, saved: Any, then: Path | None, now: Any) -> bool:
    """The saved setting, typed in ``then`` (None: not known), and this run's, typed here,
    name one file or folder that is there (:func:`typed_path`)."""
    found = typed_path(section, name, saved), typed_path(section, name, now)
    if then is None or found[0] is None or found[1] is None or found[0][0] != found[1][0]:
        return False
    place = found_place(found[0][1], then)
    return place is not None and place == found_place(found[1][1], Path.cwd())


def trainer_state(
    position: Position,
    *,
    loss_tokens_seen: int,
    world_size: int,
    total_iterations: int,
    lr_state: dict[str, Any],
    settings: dict[str, dict[str, Any]],
    fingerprint: str,
    global_batch_tokens: int | None = None,
) -> dict[str, Any]:
    """What a checkpoint records of the run beside the model and the optimizer
    (``trainer.json``): where it stands, its planned steps, its learning-rate schedule,
    its settings, the global batch (tokens) it trains, its default included
    (:data:`BATCH_RECORD`; ``None``: given in samples), its dataset's fingerprint, and
    the directory it was started in (the
    settings' relative paths, a model folder ``hf:DIR`` as typed, are relative to it:
    ``export`` from elsewhere resolves them there)."""
    return {
        "position": position.to_json(),
        "iterations_done": position.iterations_done,
        "samples_seen": position.samples_seen,
        "loss_tokens_seen": loss_tokens_seen,
        "epoch": position.epoch,
        "world_size": world_size,
        "total_iterations": total_iterations,
        "lr_scheduler": lr_state,
        "config": settings,
        BATCH_RECORD: global_batch_tokens,
        "dataset_fingerprint": fingerprint,
        "start_dir": os.getcwd(),
    }


def check_step_records(out: Path) -> None:
    """Refuse a step record that is not a regular file, before anything is loaded."""
    for name in STEP_RECORDS:
        check_regular(out / name)


def keep_records_below(out: Path, done: int) -> None:
    """The step records of the run folder ``out`` without the steps from ``done`` on (a
    resumed run runs them again; 0: a fresh start keeps none)."""
    for name in STEP_RECORDS:
        _truncate_jsonl(out / name, done)


def add_to_record(out: Path, iteration: int, found: dict[str, Any]) -> bool:
    """Add ``found`` to the ``metrics.jsonl`` line of step ``iteration`` (from 0) in the
    run folder ``out``: a validation run after the line was written (a resumed run's
    owed one); False when the folder has no line of that step."""
    path = out / "metrics.jsonl"
    records = read_jsonl(path) if path.exists() else []
    hits = [r for r in records if r.get("iteration") == iteration]
    for record in hits:
        record.update(found)
    if hits:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, path)
    return bool(hits)


def step_validated(out: Path, iteration: int) -> bool:
    """Whether the ``metrics.jsonl`` line of step ``iteration`` (from 0) in the run
    folder ``out`` holds a held-out loss (a line missing counts as validated: nothing
    to add it to)."""
    path = out / "metrics.jsonl"
    records = [
        r for r in (read_jsonl(path) if path.exists() else []) if r.get("iteration") == iteration
    ]
    return not records or any(r.get("val_loss") is not None for r in records)


def _resolve_aliases(settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` with each older scheduling name and its new name
    holding the value either gave (:data:`~datacentric.settings.scheduling.OLDER_NAMES`)."""
    scheduling = dict(settings.get("scheduling", {}))
    for old, new in OLDER_NAMES.items():
        if old in scheduling or new in scheduling:
            value = scheduling.get(new)
            scheduling[old] = scheduling[new] = value if value is not None else scheduling.get(old)
    return {**settings, "scheduling": scheduling}


def _batch_trained(settings: dict[str, dict[str, Any]], recorded: Any) -> dict[str, dict[str, Any]]:
    """``settings`` (aliases resolved) with the global batch a run trains where they give
    none: the default the checkpoint's trainer record holds (``recorded``), which the
    saved run trained and a resume keeps (:func:`global_batch_to_train`), so that a
    resume giving that batch (or none) is unchanged and one giving another is refused
    naming both; ``None`` (a record saved before it held one): as typed."""
    scheduling = settings.get("scheduling", {})
    if recorded is None or any(scheduling.get(n) is not None for n in _BATCH_NAMES):
        return settings
    chosen = dict.fromkeys(("global_batch_tokens", "tokens_per_iteration"), recorded)
    return {**settings, "scheduling": {**scheduling, **chosen}}


#: The ``[scheduling]`` settings of the global batch, older names included.
_BATCH_NAMES = (*OLDER_NAMES, *OLDER_NAMES.values())


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _truncate_jsonl(path: Path, keep_below: int) -> None:
    """Keep records whose ``iteration`` < ``keep_below`` (steps after the checkpoint
    are re-run on resume and must not be logged twice)."""
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if r.get("iteration", keep_below) < keep_below]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)
