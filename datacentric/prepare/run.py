"""``prepare``: encode a media source into a ``latents:DIR`` folder, over ranks, resumably.

The folder ``OUT`` holds ``latents/NAME.safetensors`` (``frames x channels x height x
width``; ``latent_dist = sample``: the VAE's mean, with its log-variance in
``latents/NAME.logvar.safetensors``) and ``latents/NAME.text.safetensors`` (the family's
text layout) per clip, ``manifest.jsonl`` (one line per sample: ``latent``, ``text``,
``source``, ``caption``),
``empty_prompt.text.safetensors`` (the pipeline's embedding of the empty prompt, which a
caption ``[training] caption_dropout`` drops trains on) and ``prepare_report.json``.
Under ``OUT/.prepare/`` it keeps the settings the folder was made with and one record per
finished (or skipped) clip, each written to a temporary name and renamed, after the
clip's files: a killed run resumes where it stopped, a rerun with the same inputs encodes
nothing (when every clip is recorded it starts no rank and loads no pipeline: it writes
the manifest and report again and says so), and the manifest, written last, lists what
a run that was never interrupted lists. A record states the media reading it was encoded from
(:data:`~datacentric.data.media_decode.READING_REVISION`); a clip an earlier reading
encoded is encoded again, its files replaced.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from datacentric.data.base import DataError
from datacentric.data.latent_files import read_latent_listing
from datacentric.data.latents import EMPTY_PROMPT
from datacentric.data.media_decode import READING_REVISION, MediaError, decode
from datacentric.data.video_geometry import Geometry
from datacentric.log import quiet_loading
from datacentric.models.diffusers_encode import (
    CaptionLength,
    PipelineEncoder,
    open_pipeline,
    pipeline_geometry,
)
from datacentric.parallel.launch import launch
from datacentric.prepare.plan import PrepareJob, PreparePlan, Task, media_unit, plan_prepare
from datacentric.progress import TimeLeft, counted, elapsed_text
from datacentric.regular_files import read_json_file

STATE = ".prepare"
MANIFEST = "manifest.jsonl"
REPORT = "prepare_report.json"
TMP_SUFFIX = ".tmp"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name and a rename; a failed write
    removes its temporary file, and a full disk is one error naming ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(
                f"{path}: no space left on its disk writing {len(data):,} bytes; free space "
                "(or choose another --out) and rerun: finished clips are kept"
            ) from None
        raise


def _remove_stale_temporaries(out: Path) -> None:
    """The temporary files a killed or failed earlier run left (never renamed into place)."""
    for folder in (out, out / "latents", out / STATE, out / STATE / "records"):
        for path in folder.glob(f".*{TMP_SUFFIX}") if folder.is_dir() else ():
            path.unlink(missing_ok=True)


def _write_json(path: Path, value: Any) -> None:
    _write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def _write_tensor(path: Path, tensor: torch.Tensor, key: str) -> None:
    from safetensors.torch import save

    _write_atomic(path, save({key: tensor.contiguous()}))


def claim_folder(job: PrepareJob, *, create: bool = True) -> Path:
    """Create ``OUT`` (or reuse one this job's settings made); :class:`DataError` for a
    folder made with other settings or holding other files. ``create=False``: those
    refusals alone, nothing made (before the media are read)."""
    out = Path(job.out).expanduser()
    state = out / STATE
    settings = job.settings()
    if (state / "settings.json").is_file():
        old = json.loads((state / "settings.json").read_text(encoding="utf-8"))
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if changed:
            differ = ", ".join(_change(k, old.get(k), settings.get(k)) for k in changed)
            raise DataError(
                f"--out {out}: prepared with other settings: {differ}; "
                "choose a new --out, or the same settings to resume"
            )
    elif out.exists() and any(p.name not in (STATE, "latents") for p in out.iterdir()):
        raise DataError(f"--out {out}: a non-empty folder that prepare did not make")
    if not create:
        return out
    (state / "records").mkdir(parents=True, exist_ok=True)
    (out / "latents").mkdir(exist_ok=True)
    _remove_stale_temporaries(out)
    _write_json(state / "settings.json", settings)
    return out


def _change(key: str, then: Any, now: Any) -> str:
    """``key (THEN -> NOW)``, a setting the folder was prepared with and this run's, as
    the resume check words them; a bucket table by its file's SHA-256 (its first 12
    digits), which is what the folder records."""
    if key == "bucket_config":
        then, now = (f"sha256 {v[:12]}" if v else "none" for v in (then, now))
        return f"{key} ({then} -> {now})"
    return f"{key} ({then!r} -> {now!r})"


def _record_path(out: Path, task: Task) -> Path:
    return out / STATE / "records" / f"{task.item.name}.json"


def _done_record(out: Path, task: Task) -> dict[str, Any] | None:
    """The record an earlier run wrote for ``task`` when it matches the task, else None."""
    path = _record_path(out, task)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return record if record["key"] == task.key() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _earlier_records(
    out: Path, mine: list[Task], say: Callable[[str], None]
) -> tuple[dict[int, dict[str, Any] | None], int]:
    """Each clip's record from an earlier run (None: to encode), by ``id`` of its task,
    and how many clips are encoded again because an earlier reading of the media
    (another :data:`~datacentric.data.media_decode.READING_REVISION`, or none stated:
    an earlier version) encoded them, said in one line: kept, their latents would mix
    two readings of the files in one dataset. A file skipped before it is encoded whose
    record gives another reason (an earlier version's wording) is recorded again with
    this version's, as a fresh ``prepare`` reports it (nothing encoded)."""
    done: dict[int, dict[str, Any] | None] = {}
    earlier: dict[str, Any] = {}  # the clips' names -> the reading that encoded them
    for task in mine:
        record = _done_record(out, task)
        if record is not None and task.plan is None and record.get("skipped") != task.skip:
            record = None  # recorded again with this version's reason
        if record is not None and task.plan is not None:
            reading = record.get("reading", 0)
            if reading != READING_REVISION:
                earlier[task.item.name] = reading
                record = None  # its file is read differently now: encoded again
        done[id(task)] = record
    if earlier:
        unit, plural = media_unit([t.item for t in mine if t.item.name in earlier])
        revisions = ", ".join(sorted({str(r) for r in earlier.values()}))
        say(
            f"encoding again {counted(len(earlier), unit, plural=plural)} that an earlier "
            f"version read (media reading revision {revisions}, now {READING_REVISION}: it "
            "read some files differently), so that every sample comes of one reading"
        )
    return done, len(earlier)


def _sample_names(task: Task) -> list[str]:
    """The latent file names of a clip's samples: its name, or ``NAME-wK`` for each of
    several windows."""
    windows = task.plan.windows
    name = task.item.name
    return [name] if len(windows) == 1 else [f"{name}-w{k}" for k in range(len(windows))]


def _encode_one(
    encoder: PipelineEncoder, out: Path, task: Task, latent_dist: str = "mode"
) -> dict[str, Any]:
    """Encode one clip (each of its samples) and write its files (``latent_dist =
    sample``: the mean and the log-variance); the record of what was done."""
    record: dict[str, Any] = {"key": task.key(), "where": task.item.where}
    plan = task.plan
    wanted = sorted({i for window in plan.windows for i in window})
    try:
        decoded = dict(zip(wanted, decode(task.item, wanted)))
    except MediaError as err:
        return {**record, "skipped": str(err)}
    shapes = []
    for name, window in zip(_sample_names(task), plan.windows):
        pixels = encoder.pixels([decoded[i] for i in window], plan.height, plan.width)
        if latent_dist == "sample":
            latent, logvar = encoder.latent_distribution(pixels)
            _write_tensor(out / "latents" / f"{name}.logvar.safetensors", logvar, "logvar")
        else:
            latent = encoder.latent(pixels)
        _write_tensor(out / "latents" / f"{name}.safetensors", latent, "latent")
        shapes.append(list(latent.shape))
    text = encoder.text(task.item.caption)
    _write_tensor(out / "latents" / f"{task.item.name}.text.safetensors", text, "text")
    return {**record, "shape": shapes[0], "shapes": shapes, "text_shape": list(text.shape)}


def _say(rank: int, world: int, line: str) -> None:
    prefix = f"prepare: rank {rank}: " if world > 1 else "prepare: "
    print(prefix + line, file=sys.stderr, flush=True)


def encode_rank(
    job: PrepareJob, plan: PreparePlan, clock: Callable[[], float] = time.perf_counter
) -> dict[str, Any]:
    """One rank's clips: encode those not recorded yet; returns its counts and time
    (``clock``: seconds; tests script it)."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    out = Path(job.out).expanduser()
    mine = _rank_tasks(plan, rank)
    done, again = _earlier_records(out, mine, lambda line: _say(rank, plan.world, line))
    todo = [t for t in mine if done[id(t)] is None]
    start = clock()
    encoded, cost_done = 0, 0
    total_cost = sum(t.cost for t in todo) or 1
    encoder = None

    def opened() -> PipelineEncoder:
        nonlocal encoder
        if encoder is None:
            device = job.device or ("cuda" if torch.cuda.is_available() else "cpu")
            if device == "cuda" and distributed:
                device = f"cuda:{rank % torch.cuda.device_count()}"
            with quiet_loading():  # its loader bars, when prepare runs from Python too
                pipe = open_pipeline(job.pipeline, device)
            encoder = PipelineEncoder(
                pipe, max_text_tokens=job.max_text_tokens, vae_tiling=job.vae_tiling
            )
        return encoder

    if rank == 0 and not (out / EMPTY_PROMPT).is_file():
        # what a caption that [training] caption_dropout drops trains on; a folder
        # prepared before this file existed gets it from a rerun (nothing else encoded)
        _write_tensor(out / EMPTY_PROMPT, opened().text(""), "text")
    if any(task.plan is not None for task in todo):
        opened()  # loaded before the time left starts counting: it is no clip's cost
    # the time left by encoding cost (frames x pixels), the first clip's warm-up left out
    left = TimeLeft(total_cost, start=clock())
    unit, plural = media_unit([task.item for task in todo])  # what each line counts
    for number, task in enumerate(todo, 1):
        if task.plan is None:
            record = {"key": task.key(), "where": task.item.where, "skipped": task.skip}
        else:
            record = _encode_one(opened(), out, task, job.latent_dist)
            encoded += "skipped" not in record
            cost_done += task.cost
        _write_json(_record_path(out, task), {**record, "reading": READING_REVISION})
        now = clock()
        rate = number / (now - start) if now > start else 0.0
        left.reached(cost_done, now)
        said = left.seconds(now) if cost_done < total_cost else 0.0
        time_left = "" if said is None else f", {elapsed_text(said)} left"
        _say(
            rank,
            plan.world,
            f"{number}/{counted(len(todo), unit, plural=plural)}, {rate:.2f}/s{time_left}",
        )
    return _rank_result(plan, rank, done, encoded, again, clock() - start)


def _rank_tasks(plan: PreparePlan, rank: int) -> list[Task]:
    """The clips ``rank`` encodes: a repeated line is its first copy's sample, with no
    record of its own (the record's file is the first copy's)."""
    return [t for t in plan.tasks if t.rank == rank and t.duplicate_of is None]


def _rank_result(
    plan: PreparePlan,
    rank: int,
    done: dict[int, dict[str, Any] | None],
    encoded: int,
    again: int,
    seconds: float,
) -> dict[str, Any]:
    """What a rank reports of its clips (``done``: :func:`_earlier_records`'s)."""
    return {
        "rank": rank,
        "clips": len(done),
        "assigned_cost": plan.assigned_cost[rank],
        "encoded": encoded,
        # samples an earlier run encoded (its skipped clips are not counted)
        "already_done": sum(1 for r in done.values() if r is not None and "shape" in r),
        "encoded_again": again,
        "seconds": round(seconds, 3),
    }


def _finished_ranks(job: PrepareJob, plan: PreparePlan) -> list[dict[str, Any]] | None:
    """Every rank's report as :func:`encode_rank` gives it when an earlier run left
    nothing to encode (each clip recorded at this media reading with these settings, as
    the ranks' own resume check finds it, and the empty prompt's file written), else
    None."""
    out = Path(job.out).expanduser()
    if not (out / EMPTY_PROMPT).is_file():
        return None
    results = []
    for rank in range(plan.world):
        done, again = _earlier_records(out, _rank_tasks(plan, rank), lambda line: None)
        if any(record is None for record in done.values()):
            return None  # a clip to encode (the ranks say why one is encoded again)
        results.append(_rank_result(plan, rank, done, 0, again, 0.0))
    return results


def write_outputs(job: PrepareJob, plan: PreparePlan, ranks: list[dict]) -> dict[str, Any]:
    """The manifest (samples in source order) and ``prepare_report.json``; the report."""
    out = Path(job.out).expanduser()
    lines, skipped, truncated, rotated, paged = [], [], 0, 0, []
    for task in plan.tasks:
        if task.duplicate_of is not None:
            where = task.item.where
            skipped.append({"source": task.item.source, "where": where, "reason": task.skip})
            continue
        try:
            record = json.loads(_record_path(out, task).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {"skipped": "not encoded (its rank did not finish)"}
        if "skipped" in record:
            skipped.append(
                {"source": task.item.source, "where": task.item.where, "reason": record["skipped"]}
            )
            continue
        truncated += task.truncate
        if task.pages > 1:  # its first page alone is a sample
            paged.append(_pages_entry(task))
        for name, window in zip(_sample_names(task), task.plan.windows):
            rotated += task.plan.rotated
            entry = {
                "latent": f"latents/{name}.safetensors",
                "text": f"latents/{task.item.name}.text.safetensors",
                "source": task.item.source,
                "caption": task.item.caption,
                "frames": len(window),
                "frame_range": [min(window), max(window) + 1],
                "bucket": task.plan.bucket,
            }
            if job.latent_dist == "sample":
                entry["logvar"] = f"latents/{name}.logvar.safetensors"
            lines.append(_json_line(entry))
    costs = [r["assigned_cost"] for r in ranks]
    earlier, earlier_media = _earlier_run(out)
    listed = {json.loads(line)["latent"] for line in lines}
    report = {
        "pipeline": job.pipeline,
        "media": job.media,
        "clips": len(plan.tasks),
        "samples": len(lines),
        "no_longer_listed": len(earlier - listed),
        "earlier_media": earlier_media,
        "encoded": sum(r["encoded"] for r in ranks),
        "already_done": sum(r["already_done"] for r in ranks),
        "encoded_again": sum(r["encoded_again"] for r in ranks),
        "skipped": len(skipped),
        "duplicates": sum(task.duplicate_of is not None for task in plan.tasks),
        "skipped_files": skipped,
        "pages_left_out": paged,
        "captions_truncated": truncated,
        "rotated": rotated,
        "world": plan.world,
        "ranks": ranks,
        "cost_imbalance": round(1 - min(costs) / max(costs), 4) if max(costs) else 0.0,
    }
    _write_json(out / REPORT, report)
    _write_atomic(out / MANIFEST, ("\n".join(lines) + "\n" if lines else "").encode())
    return report


def _pages_entry(task: Task) -> dict[str, Any]:
    """A TIFF of several pages in ``prepare_report.json``: its pages, those left out."""
    left_out = "2" if task.pages == 2 else f"2-{task.pages}"
    return {
        "source": task.item.source,
        "where": task.item.where,
        "pages": task.pages,
        "left_out": left_out,
    }


def _earlier_run(out: Path) -> tuple[set[str], str | None]:
    """The samples (latent files, relative to ``out``) the manifest in ``out`` lists, read
    as ``latents:OUT`` reads it, and the ``--media`` of the run that wrote it (its
    report's): what a run of another source no longer lists. A manifest or report that
    does not read is no earlier run (the note is left out)."""
    try:
        listed = read_latent_listing(str(out / MANIFEST)) if (out / MANIFEST).exists() else []
        report = read_json_file(out / REPORT) if (out / REPORT).exists() else {}
        samples = {entry.latent.relative_to(out).as_posix() for entry in listed}
    except (ValueError, OSError):  # a name outside out: relative_to's ValueError
        return set(), None
    media = report.get("media")
    return samples, media if isinstance(media, str) else None


#: Line breaks to ``str.splitlines`` that JSON keeps raw: escaped in the manifest, so a
#: reader splitting it at any line break still reads one sample a line
_RAW_BREAKS = {ord(c): f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"}


def _json_line(entry: dict[str, Any]) -> str:
    """``entry`` as one manifest line: UTF-8 text, the same values (captions exactly)."""
    return json.dumps(entry, ensure_ascii=False).translate(_RAW_BREAKS)


def _gathering_rank(job: PrepareJob, plan: PreparePlan) -> dict[str, Any]:
    """A rank's clips; rank 0 then writes the manifest and report from every rank's."""
    import torch.distributed as dist

    result = encode_rank(job, plan)
    if dist.is_available() and dist.is_initialized() and plan.world > 1:
        gathered: list[Any] = [None] * plan.world
        dist.all_gather_object(gathered, result)
        if result["rank"] == 0:
            return {**result, "report": write_outputs(job, plan, gathered)}
        return result
    return {**result, "report": write_outputs(job, plan, [result])}


def prepare(job: PrepareJob) -> dict[str, Any]:
    """Run ``prepare`` (see the module docstring); returns ``prepare_report.json``."""
    from datacentric.parallel.launch import launch_mode

    mode = launch_mode(job.world if job.world > 1 else None)
    world = mode.world_size
    temporal, multiple = pipeline_geometry(job.pipeline)
    tokens = CaptionLength(job.pipeline, job.max_text_tokens)
    job = replace(job, max_text_tokens=tokens.limit)  # the folder records the length used
    claim_folder(job, create=False)  # a wrong --out before every file's header is read
    plan = plan_prepare(job, Geometry(temporal, multiple), tokens, world)
    claim_folder(job)
    finished = _finished_ranks(job, plan)
    if finished is not None and mode.kind != "torchrun":  # no rank to start, no encoder
        return _nothing_to_encode(job, plan, finished)
    if finished is None and os.environ.get("RANK", "0") == "0":  # once under torchrun
        _say(
            0,
            1,
            f"loading the pipeline on {counted(world, 'rank')} (seconds for a small one, a "
            "minute or more for a full-size one), then each clip or image with the time left",
        )
    results = launch(_gathering_rank, job, plan, nproc=job.world if job.world > 1 else None)
    report = next((r["report"] for r in results.values() if "report" in r), None)
    return report if report is not None else {"rank": next(iter(results))}


def _nothing_to_encode(
    job: PrepareJob, plan: PreparePlan, finished: list[dict[str, Any]]
) -> dict[str, Any]:
    """A rerun that found every clip done (:func:`_finished_ranks`): the manifest and
    report written again, as its ranks would write them, said in one line."""
    report = write_outputs(job, plan, finished)
    unit, plural = media_unit([task.item for task in plan.tasks])
    _say(
        0,
        1,
        f"nothing to encode: all {counted(len(plan.tasks), unit, plural=plural)} of "
        f"{job.media} are done in {job.out} at media reading revision {READING_REVISION} "
        f"with these settings ({counted(report['samples'], 'sample')}, "
        f"{report['skipped']} skipped); no rank started, the manifest and {REPORT} "
        "written again",
    )
    return report
