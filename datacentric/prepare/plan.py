"""What ``prepare`` will do, decided before any clip is encoded, the same on every rank.

:func:`plan_prepare` reads the media source, each file's header and each caption, and
gives every clip a :class:`Task`: its output name, the frames and size it is encoded at
(:func:`~datacentric.data.clip_plans.plan_clip`) or the reason it is skipped, and the rank
that encodes it. Ranks get clips by encoding cost (frames x pixels), largest first, each
to the rank with the least cost so far (:func:`~datacentric.scheduling.balance.lpt`).
"""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.bucket_config import BucketConfig
from datacentric.data.clip_plans import ClipPlan, clip_rng, plan_clip
from datacentric.data.frame_sampling import FrameSampling
from datacentric.data.media_decode import MediaError, probe
from datacentric.data.media_sources import MediaItem, read_media_source
from datacentric.data.video_geometry import Geometry
from datacentric.progress import counted
from datacentric.regular_files import kind_of
from datacentric.scheduling.balance import lpt

#: a list of clips and captions a folder may hold beside them (read when given as --media)
LIST_SUFFIXES = (".csv", ".jsonl", ".json")

CAPTION_RULES = ("truncate", "skip", "error")
LATENT_DISTS = ("mode", "sample")
#: the frame-sampling settings, recorded in the folder's settings
SAMPLING_KEYS = (
    "max_frames",
    "frame_stride",
    "target_fps",
    "frame_extraction",
    "windows",
    "window_stride",
)


@dataclass(frozen=True, kw_only=True)
class PrepareJob:
    """The settings of one ``prepare``: what the output depends on, and how it runs."""

    pipeline: str
    """A diffusers pipeline folder (``model_index.json``)."""
    media: str
    """A CSV/JSONL list of ``path,caption``, or a folder with ``NAME.txt`` captions."""
    out: str
    """The ``latents:DIR`` folder written."""
    bucket_config: str | None = None
    """Open-Sora bucket config (JSON); default: each clip's own size and frames."""
    caption_rule: str = "truncate"
    """A caption over the text encoder's length: ``truncate`` (as the pipeline does,
    counted), ``skip`` or ``error``; a missing or empty caption is skipped, or an error
    under ``error``."""
    max_text_tokens: int | None = None
    """Text length, >= 1 (default: the pipeline's own ``max_sequence_length``; the folder's
    settings record the length used)."""
    vae_tiling: bool = False
    """Encode with the VAE's tiling (long or large clips; slightly different values)."""
    seed: int = 0
    """Seed of the bucket keep-probability draws, >= 0."""
    world: int = 1
    """Ranks (processes) encoding at once, >= 1; torchrun's world when under torchrun."""
    device: str | None = None
    """Device of the encoders (default: a rank's GPU when there is one, else the CPU)."""
    max_frames: int | None = None
    """Frames per sample at most (default: as many as the clip and bucket give)."""
    frame_stride: int = 1
    """Keep every n-th frame (after ``target_fps``)."""
    target_fps: float | None = None
    """Frame rate clips are resampled to: output frame ``i`` is the source frame nearest
    ``i / target_fps`` seconds (default: each clip's own frames)."""
    frame_extraction: str | None = None
    """``head``, ``uniform``, ``slide`` or ``chunk`` (default: ``head``; ``uniform``
    with a bucket config); see :mod:`~datacentric.data.frame_sampling`."""
    windows: int | None = None
    """Samples per clip under ``slide`` (default 1) and ``chunk`` (default: all that fit)."""
    window_stride: int | None = None
    """Frames between ``slide`` windows' starts (default: spread evenly over the clip)."""
    latent_dist: str = "mode"
    """What a latent file holds: ``mode`` (the VAE's mode, as the pipelines encode) or
    ``sample`` (its mean, with the log-variance in ``NAME.logvar.safetensors``: training
    draws each epoch's latent from them, :mod:`~datacentric.data.diffusion_draws`)."""

    def sampling(self) -> FrameSampling:
        """The frame-sampling options (:class:`DataError` naming a flag out of range)."""
        return FrameSampling(**{key: getattr(self, key) for key in SAMPLING_KEYS})

    def __post_init__(self) -> None:
        self.sampling()
        if self.caption_rule not in CAPTION_RULES:
            raise DataError(
                f"--caption-rule {self.caption_rule!r}: choose one of {', '.join(CAPTION_RULES)}"
            )
        _at_least("--world", self.world, 1)
        if self.max_text_tokens is not None:  # None: the pipeline's own
            _at_least("--max-text-tokens", self.max_text_tokens, 1)
        _at_least("--seed", self.seed, 0)
        if self.latent_dist not in LATENT_DISTS:
            raise DataError(
                f"--latent-dist {self.latent_dist!r}: choose one of {', '.join(LATENT_DISTS)}"
            )

    def settings(self) -> dict[str, Any]:
        """What the output depends on (a rerun with other values refuses the folder)."""
        keys = ("caption_rule", "max_text_tokens", "vae_tiling", "seed", *SAMPLING_KEYS)
        out = {k: getattr(self, k) for k in keys}
        out["pipeline"] = str(Path(self.pipeline).expanduser().resolve())
        out["bucket_config"] = _file_hash(self.bucket_config)
        if self.latent_dist != "mode":  # a folder made before the setting reads as mode
            out["latent_dist"] = self.latent_dist
        return out


def _at_least(flag: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise DataError(f"{flag} {value!r}: must be an integer >= {least}")


def _file_hash(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        raise DataError(f"--bucket-config {path}: no such file") from None


@dataclass(frozen=True)
class Task:
    """One clip: where it comes from, how it is encoded (or why not), and by which rank."""

    item: MediaItem
    plan: ClipPlan | None
    skip: str | None
    rank: int = 0
    stamp: tuple[int, int] | None = None
    """The media file's size and modification time (a changed file is redone)."""
    truncate: bool = False
    """The caption is longer than the text encoder takes (truncated, counted)."""
    duplicate_of: str | None = None
    """Where the same path and caption were listed first (this copy is not a sample)."""
    pages: int = 1
    """A TIFF's pages: its first alone is encoded, the others are named in the report."""

    @property
    def cost(self) -> int:
        """Encoding cost: frames x pixels (0 when skipped)."""
        return 0 if self.plan is None else self.plan.cost

    def key(self) -> dict[str, Any]:
        """What a finished record must match for the clip to count as done."""
        plan = None if self.plan is None else asdict(self.plan)
        return {
            "source": self.item.source,
            "caption": self.item.caption,
            "stamp": list(self.stamp) if self.stamp else None,
            "plan": json.loads(json.dumps(plan)),
        }


def media_unit(items: list[MediaItem]) -> tuple[str, str]:
    """What ``items`` are, to count them by in what ``prepare`` says (one unit and its
    plural): ``image`` (image files alone), ``clip``, or ``clip or image`` (both)."""
    images = sum(item.is_image for item in items)
    if images and images < len(items):
        return "clip or image", "clips and images"
    return ("image", "images") if images else ("clip", "clips")


@dataclass
class PreparePlan:
    """Every clip's :class:`Task`, in source order, and the ranks' assigned cost."""

    tasks: list[Task]
    world: int
    assigned_cost: list[int] = field(default_factory=list)


def _stamp(path: Path) -> tuple[int, int] | str:
    """The file's size and modification time, or why it is no media file (missing, a
    FIFO or folder: never opened, a FIFO would block the decoder)."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return "missing: no such file"
    except OSError as err:
        return f"unreadable: {err.strerror or err}"
    if not stat.S_ISREG(found.st_mode):
        return f"not a media file: {kind_of(found.st_mode)}"
    return int(found.st_size), int(found.st_mtime_ns)


def _caption_problem(caption: str | None, rule: str, where: str) -> str | None:
    if caption is not None and caption.strip():
        return None
    what = "missing caption" if caption is None else "empty caption"
    if rule == "error":
        raise DataError(f"{where}: {what} (write one, or pass --caption-rule skip)")
    return what


def plan_task(
    item: MediaItem,
    geometry: Geometry,
    buckets: BucketConfig | None,
    job: PrepareJob,
    tokens: Any,
    seen: dict[str, str],
) -> Task:
    """The task of one clip (unassigned); ``tokens(caption)`` counts its text tokens;
    ``seen`` maps the names planned so far to where they were listed."""
    if item.unread:  # a folder's file no sample comes of: skipped, its caption unread
        return Task(item, None, item.unread)
    if item.name in seen:
        first = seen[item.name]
        return Task(item, None, f"duplicate of {first} (same path and caption)", duplicate_of=first)
    seen[item.name] = item.where
    stamp = _stamp(item.path)
    problem = _caption_problem(item.caption, job.caption_rule, item.where)
    if problem:
        return Task(item, None, problem, stamp=None if isinstance(stamp, str) else stamp)
    if isinstance(stamp, str):
        return Task(item, None, stamp)
    try:
        info = probe(item, times=job.sampling().needs_times)
    except MediaError as err:
        return Task(item, None, str(err), stamp=stamp)
    rng = clip_rng(item, job.seed)
    # one frame of an image file or a GIF is a still (an animated WebP or PNG is a clip)
    still = info.frames == 1 and (item.is_image or item.path.suffix.lower() == ".gif")
    plan = plan_clip(
        info, geometry, is_image=still, buckets=buckets, rng=rng, sampling=job.sampling()
    )
    if isinstance(plan, str):
        return Task(item, None, plan, stamp=stamp)
    count = tokens(item.caption)
    if count > tokens.limit:
        if job.caption_rule == "error":
            raise DataError(
                f"{item.where}: caption of {count} tokens, over the text encoder's "
                f"{tokens.limit} (shorten it, or pass --caption-rule truncate or skip)"
            )
        if job.caption_rule == "skip":
            return Task(item, None, f"caption of {count} tokens, over {tokens.limit}", stamp=stamp)
        return Task(item, plan, None, stamp=stamp, truncate=True)
    return Task(item, plan, None, stamp=stamp)


def tiff_pages(path: Path) -> int:
    """The pages of a TIFF file (1 for any other file, or a TIFF Pillow cannot open:
    its reading names that)."""
    if path.suffix.lower() not in (".tif", ".tiff"):
        return 1
    try:
        from PIL import Image

        with Image.open(path) as image:
            return int(getattr(image, "n_frames", 1))
    except Exception:  # noqa: BLE001 - the decoder says why it does not read
        return 1


def _with_pages(task: Task) -> Task:
    """``task`` with its file's pages stated, when it is a TIFF of several encoded."""
    pages = 1 if task.plan is None else tiff_pages(task.item.path)
    return task if pages == 1 else replace(task, pages=pages)


def assign_ranks(tasks: list[Task], world: int) -> PreparePlan:
    """Each task's rank: largest cost first, to the rank with the least cost so far."""
    costs = np.array([[float(t.cost)] for t in tasks]).reshape(len(tasks), 1)
    owner, _ = lpt(costs, [0] * world, [1])
    placed = [replace(t, rank=int(r)) for t, r in zip(tasks, owner)]
    loads = [sum(t.cost for t in placed if t.rank == r) for r in range(world)]
    return PreparePlan(placed, world, loads)


def plan_prepare(job: PrepareJob, geometry: Geometry, tokens: Any, world: int) -> PreparePlan:
    """Read the source, plan every clip and assign it to one of ``world`` ranks."""
    items = read_media_source(job.media)
    buckets = BucketConfig.load(job.bucket_config) if job.bucket_config else None
    seen: dict[str, str] = {}
    tasks = [_with_pages(plan_task(item, geometry, buckets, job, tokens, seen)) for item in items]
    if not any(task.plan for task in tasks):
        first = tasks[0]
        unit, plural = media_unit(items)
        raise DataError(
            f"--media {job.media}: none of its {counted(len(tasks), unit, plural=plural)} "
            f"can be encoded (the first, {first.item.where}: {first.skip}); nothing to "
            f"prepare{_list_beside(job.media, first.skip)}"
        )
    return assign_ranks(tasks, world)


def _list_beside(media: str, skip: str | None) -> str:
    """Where a folder's clips have no ``NAME.txt`` caption but the folder holds a list
    of them (``captions.csv``, ``clips.jsonl``): the ``--media`` that reads it."""
    folder = Path(media).expanduser()
    if skip != "missing caption" or not folder.is_dir():
        return ""
    lists = sorted(p for p in folder.glob("*") if p.suffix.lower() in LIST_SUFFIXES)
    if not lists:
        return ""
    return f": {folder / lists[0].name} lists captions, pass it as --media to read them"
