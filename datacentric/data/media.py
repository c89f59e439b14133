"""Raw media for ``datacentric prepare``: which clips and captions a source lists, how
each clip is read, and which frames and size it is encoded at.

- Sources (:func:`read_media_source`): a CSV or JSONL file of ``path`` and ``caption``
  (Open-Sora's ``text`` column, and ``video``/``file``/``prompt``, are accepted), paths
  relative to the file's folder and never outside it; or a folder where every clip or
  image has its caption beside it in ``NAME.txt`` (as finetrainers and musubi-tuner
  read them). A line without a caption keeps ``caption = None``: the caption rule of
  ``prepare`` decides.
- Reading: videos with PyAV (``av``, in the ``video`` extra), images with Pillow; both
  give RGB :class:`PIL.Image.Image` frames. A file either library fails on is a
  :class:`MediaError` naming the file.
- Geometry (:func:`plan_clip`): the frames and pixel size a clip is encoded at, or why
  it cannot be (too short, too small, no bucket keeps it).
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.bucket_config import BucketConfig, closest_ratio

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v", ".gif")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
PATH_COLUMNS = ("path", "video", "file", "image")
CAPTION_COLUMNS = ("caption", "text", "prompt")


class MediaError(ValueError):
    """A clip that cannot be read: the reason, for ``prepare_report.json``."""


@dataclass(frozen=True)
class MediaItem:
    """One clip or image of a media source and its caption."""

    index: int
    """Position in the source (sample order of the manifest)."""
    path: Path
    source: str
    """The path as the source gives it (the manifest's ``source``)."""
    caption: str | None
    where: str
    """Where it was listed (``FILE:LINE`` or the caption file), for messages."""

    @property
    def is_image(self) -> bool:
        """An image (one frame) by its suffix."""
        return self.path.suffix.lower() in IMAGE_SUFFIXES

    @property
    def name(self) -> str:
        """The output name: the file's stem and a hash of its source and caption, so an
        edited caption or an inserted line never reuses another clip's files."""
        key = f"{self.source}\0{self.caption}".encode()
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.path.stem)[:60]
        return f"{stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) not in (None, "")), None)


def _inside(folder: Path, given: str, where: str) -> Path:
    path = (folder / given).resolve()
    if Path(given).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise DataError(
            f"{where}: path {given!r} is outside the list's folder {folder}; paths in a "
            "media list are relative to it (move the list beside the clips)"
        )
    return path


def _rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        return [(f"{path}:{n}", row) for n, row in enumerate(reader, 2)]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: not JSON ({err})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: want an object with path and caption")
        rows.append((f"{path}:{number}", row))
    return rows


def _list_file(path: Path) -> list[MediaItem]:
    items = []
    for where, row in _rows(path):
        given = _pick(row, PATH_COLUMNS)
        if given is None:
            raise DataError(f"{where}: no media path (a column {', '.join(PATH_COLUMNS)})")
        # an empty caption cell stays "" (the caption rule skips it); no column is None
        caption = next((row[n] for n in CAPTION_COLUMNS if row.get(n) is not None), None)
        media = _inside(path.parent, str(given), where)
        items.append(MediaItem(len(items), media, str(given), caption, where))
    return items


def _list_folder(folder: Path) -> list[MediaItem]:
    items = []
    suffixes = VIDEO_SUFFIXES + IMAGE_SUFFIXES
    for media in sorted(p for p in folder.rglob("*") if p.suffix.lower() in suffixes):
        caption_file = media.with_suffix(".txt")
        caption = (
            caption_file.read_text(encoding="utf-8").strip() if caption_file.is_file() else None
        )
        given = media.relative_to(folder).as_posix()
        items.append(MediaItem(len(items), media, given, caption, str(caption_file)))
    return items


def read_media_source(source: str | Path) -> list[MediaItem]:
    """The clips and captions of a CSV/JSONL list or a folder, in order (see the module
    docstring); :class:`DataError` for a missing source or a malformed line."""
    path = Path(source).expanduser()
    if path.is_dir():
        items = _list_folder(path)
    elif path.is_file() and path.suffix.lower() in (".csv", ".jsonl", ".json"):
        items = _list_file(path)
    elif path.exists():
        raise DataError(f"--media {source}: want a .csv or .jsonl list, or a folder")
    else:
        raise DataError(f"--media {source}: no such file or folder")
    if not items:
        raise DataError(f"--media {source}: lists no clip or image")
    return items


@dataclass(frozen=True)
class MediaInfo:
    """What a file's header says: frames (1 for an image) and pixel size."""

    frames: int
    height: int
    width: int


def probe(item: MediaItem) -> MediaInfo:
    """Frames and size from the header (a video's frame count may be an estimate);
    :class:`MediaError` when the file cannot be opened."""
    if not item.path.is_file():
        raise MediaError("missing: no such file")
    if item.is_image:
        from PIL import Image

        try:
            with Image.open(item.path) as image:
                return MediaInfo(1, image.height, image.width)
        except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
            raise MediaError(f"unreadable image ({type(err).__name__}: {err})") from None
    import av

    try:
        with av.open(str(item.path)) as container:
            stream = container.streams.video[0]
            frames = int(stream.frames or 0)
            if frames == 0 and stream.duration and stream.average_rate:
                frames = int(float(stream.duration * stream.time_base * stream.average_rate))
            return MediaInfo(frames, stream.codec_context.height, stream.codec_context.width)
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt or unreadable video ({type(err).__name__}: {err})") from None


def decode(item: MediaItem, indices: list[int] | None = None) -> list[Any]:
    """The RGB frames (``PIL.Image``) of ``item`` at ``indices`` (every frame if None);
    :class:`MediaError` when decoding fails or the clip is shorter than asked."""
    if item.is_image:
        from PIL import Image

        try:
            with Image.open(item.path) as image:
                return [image.convert("RGB")]
        except Exception as err:  # noqa: BLE001
            raise MediaError(f"unreadable image ({type(err).__name__}: {err})") from None
    import av

    wanted = None if indices is None else set(indices)
    frames: dict[int, Any] = {}
    try:
        with av.open(str(item.path)) as container:
            for number, frame in enumerate(container.decode(video=0)):
                if wanted is None or number in wanted:
                    frames[number] = frame.to_image()
                if wanted is not None and len(frames) == len(wanted):
                    break
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt video ({type(err).__name__}: {err})") from None
    order = sorted(frames) if indices is None else indices
    if any(i not in frames for i in order) or not order:
        raise MediaError(f"decoded {len(frames)} frames, fewer than the header's")
    return [frames[i] for i in order]


@dataclass(frozen=True)
class ClipPlan:
    """The frames and pixel size a clip is encoded at."""

    frames: tuple[int, ...]
    """Indices of the decoded frames kept, in order."""
    height: int
    width: int
    bucket: str

    @property
    def cost(self) -> int:
        """Encoding cost: frames x pixels."""
        return len(self.frames) * self.height * self.width


@dataclass(frozen=True)
class Geometry:
    """What a family's VAE accepts: ``temporal k + 1`` frames, sizes of ``multiple``."""

    temporal: int
    multiple: int

    def frames_below(self, frames: int) -> int:
        """The largest accepted frame count not above ``frames`` (0 if none)."""
        return 0 if frames < 1 else (frames - 1) // self.temporal * self.temporal + 1


def even_frames(total: int, count: int) -> tuple[int, ...]:
    """``count`` frame indices spread evenly over ``total`` frames, first and last kept."""
    if count == 1:
        return (0,)
    return tuple(round(i * (total - 1) / (count - 1)) for i in range(count))


def plan_clip(
    info: MediaInfo,
    geometry: Geometry,
    *,
    is_image: bool,
    buckets: BucketConfig | None = None,
    rng: np.random.Generator | None = None,
) -> ClipPlan | str:
    """The :class:`ClipPlan` of a clip, or the reason it is skipped.

    Without ``buckets``: the clip's own size rounded down to ``geometry.multiple``
    (centre-cropped) and its first frames, as many as the VAE accepts. With ``buckets``
    (Open-Sora's format): from the largest resolution down, the aspect ratio closest to
    the clip's, a size the clip reaches (rounded down to the multiple), the largest
    frame count it has (rounded down to an accepted count) sampled evenly over the clip,
    kept with the bucket's probability.
    """
    m = geometry.multiple
    if info.height < m or info.width < m:
        return f"too small: {info.height}x{info.width} pixels, the VAE needs {m}x{m}"
    least = 1 if is_image else geometry.temporal + 1
    if info.frames < least:
        return f"too short: {info.frames} frames, the VAE needs {least}"
    if buckets is None:
        count = 1 if is_image else geometry.frames_below(info.frames)
        h, w = info.height // m * m, info.width // m * m
        return ClipPlan(tuple(range(count)), h, w, f"{count}x{h}x{w}")
    rng = rng or np.random.default_rng(0)
    for res, sizes, probs in buckets.table:
        ratio = closest_ratio(sizes, info.height / info.width)
        h, w = (n // m * m for n in sizes[ratio])
        if info.height < h or info.width < w or min(h, w) < m:
            continue
        fits = [
            (n, p)
            for n, p in probs
            if (n == 1) == is_image and 0 < geometry.frames_below(n) <= info.frames
        ]
        if not fits:
            continue
        frames, keep = fits[0]
        if keep >= 1 or rng.random() < keep:
            count = geometry.frames_below(frames)
            return ClipPlan(even_frames(info.frames, count), h, w, f"{res}-{ratio}-{frames}f")
    return "no bucket of --bucket-config keeps it (too short, too small, or not drawn)"


def clip_rng(item: MediaItem, seed: int) -> np.random.Generator:
    """The draw of a clip's bucket keep-probabilities, from its name and the seed."""
    return np.random.default_rng([int(seed), int(item.name.rsplit("-", 1)[1], 16)])
