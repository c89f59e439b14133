"""Raw media for ``datacentric prepare``: which clips and captions a source lists, how
each clip is read, and which frames and size it is encoded at.

- Sources (:func:`read_media_source`): a CSV or JSONL file (or a ``.json`` file of
  JSON lines or of one array of objects) of ``path`` and ``caption``
  (Open-Sora's ``text`` column, and ``video``/``file``/``prompt``, are accepted), paths
  relative to the file's folder and never outside it; a folder holding Hugging Face's
  ``metadata.jsonl`` or ``metadata.csv`` (``file_name`` and a caption column, the
  ``imagefolder`` convention); or a folder where every clip or image has its caption
  beside it in ``NAME.txt`` (as finetrainers and musubi-tuner read them). A line
  without a caption keeps ``caption = None``: the caption rule of ``prepare`` decides.
  In such a folder a file of a kind with no reader that has a caption beside it, and a
  caption with no file of its name, are listed too, with the reason no sample comes of
  them (:attr:`MediaItem.unread`): nothing captioned is dropped without a word.
- Captions are kept exactly: a CSV is read as RFC 4180 over the whole text (quoted
  line breaks, commas and quotes kept; a UTF-8 byte-order mark and CRLF accepted), a
  JSONL file is split at LF, CRLF and CR only (U+2028, U+0085 ... stay inside a
  caption), and a ``NAME.txt`` caption is its file's text less one final line end.
- Reading: videos with PyAV (``av``, in the ``video`` extra), images with Pillow; both
  give RGB :class:`PIL.Image.Image` frames; an animated WebP or PNG (APNG) is a clip
  of its frames, timed by their durations. Every container and codec the installed
  PyAV decodes is read (MP4, MOV, MKV, WebM, AVI, GIF, 3GP, MPEG program and transport
  streams, ASF/WMV, FLV, Ogg, MXF; H.264, H.265, VP8, VP9, AV1, MPEG-1/2/4, WMV, FFV1 as
  its FFmpeg has them), from the first video stream; audio and other
  streams are never decoded. A clip's frame count is its stream's when the container
  states one, else the frames that decode (Matroska and WebM state none). Pixels come
  upright: an image's EXIF orientation (as ``ImageOps.exif_transpose`` and diffusers'
  ``load_image``) and a video's display rotation (its display matrix, else its
  ``rotate`` tag) are applied before sizes are planned and frames resized. A file either
  library fails on is a :class:`MediaError` saying why (for HEIC/HEIF and AVIF, which
  Pillow reads through a plugin, the plugin to install when it is missing).
- Geometry (:func:`plan_clip`): the frames and pixel size a clip is encoded at, or why
  it cannot be (too short, too small, no bucket keeps it).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib
import io
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.bucket_config import BucketConfig, closest_ratio
from datacentric.data.documents import paths_below
from datacentric.data.frame_sampling import (
    FrameSampling,
    even_frames,  # noqa: F401 - its home before frame_sampling; still imported from here
    frame_line,
    window_positions,
)
from datacentric.data.text_file import (
    lone_surrogate,
    numbered_lines,
    parse_json_line,
    read_text_file,
)
from datacentric.data.video_geometry import causal_latent_frames

#: a folder's clips, by suffix: the containers the installed PyAV's FFmpeg reads (each
#: written and read back in tests/runtime/data/test_media_kinds.py)
VIDEO_SUFFIXES = (
    *(".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".gif"),
    *(".3gp", ".3g2", ".mpg", ".mpeg", ".m2v", ".vob", ".ts", ".mts", ".m2ts"),
    *(".wmv", ".asf", ".flv", ".f4v", ".ogv", ".mxf"),
)
#: a folder's images: what Pillow reads (HEIC/HEIF with the pillow-heif plugin, AVIF with
#: a Pillow built with libavif or the pillow-avif-plugin: :data:`IMAGE_PLUGINS`)
IMAGE_SUFFIXES = (
    *(".png", ".jpg", ".jpeg", ".webp", ".bmp"),
    *(".tif", ".tiff", ".avif", ".heic", ".heif"),
    *(".jfif", ".jpe", ".apng"),  # JPEGs as browsers save them on Windows; animated PNG
)
#: images Pillow reads only through a plugin: suffix -> (its module, how to install it)
IMAGE_PLUGINS = {
    ".heic": ("pillow_heif", "pip install pillow-heif"),
    ".heif": ("pillow_heif", "pip install pillow-heif"),
    ".avif": (
        "pillow_avif",
        "Pillow 11.3 or later built with libavif, or pip install pillow-avif-plugin",
    ),
}
#: Pillow's formats whose files may hold an animation: several frames are a clip
ANIMATED_FORMATS = ("WEBP", "PNG")
PATH_COLUMNS = ("path", "video", "file", "image", "file_name")
#: Hugging Face's ``imagefolder`` / ``videofolder`` list, read when a folder holds one
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
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
    unread: str | None = None
    """Why no sample is read from this file of a ``NAME.txt`` folder (a kind with no
    reader, or a caption with nothing beside it): ``prepare`` lists it as skipped."""

    @property
    def is_image(self) -> bool:
        """An image file by its suffix, read with Pillow (an animated WebP or PNG is
        a clip of its frames)."""
        return self.path.suffix.lower() in IMAGE_SUFFIXES

    @property
    def name(self) -> str:
        """The output name: the file's stem and a hash of its source and caption, so an
        edited caption or an inserted line never reuses another clip's files."""
        # surrogatepass: a file name that is not UTF-8 (listed as unread) has a name too
        key = f"{self.source}\0{self.caption}".encode("utf-8", "surrogatepass")
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.path.stem)[:60]
        return f"{stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) not in (None, "")), None)


def _inside(folder: Path, given: str, where: str) -> Path:
    try:
        path = (folder / given).resolve()
    except (ValueError, OSError) as err:  # a NUL byte, a name too long
        raise DataError(f"{where}: path {given[:200]!r} is not a file name ({err})") from None
    if Path(given).is_absolute() or not path.is_relative_to(folder.resolve()):
        raise DataError(
            f"{where}: path {given!r} is outside the list's folder {folder}; paths in a "
            "media list are relative to it (move the list beside the clips)"
        )
    return path


def _csv_rows(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    """RFC 4180 over the whole text: quoted fields keep their line breaks, commas and
    doubled quotes; CRLF or LF ends a record; a record with more fields than the header
    is refused naming its line (an unquoted caption holding a comma)."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows, header, line = [], None, 1
    try:
        for record in reader:
            where, line = f"{path}:{line}", reader.line_num + 1
            if not record or (len(record) == 1 and not record[0].strip() and header):
                continue
            if header is None:
                header = [name.strip() for name in record]
                _check_columns(path, header)
                continue
            if len(record) > len(header):
                raise DataError(
                    f"{where}: {len(record)} fields, the header has {len(header)}; quote a "
                    'caption holding commas ("a cat, running")'
                )
            rows.append((where, dict(zip(header, record, strict=False))))
    except csv.Error as err:
        raise DataError(f"{path}:{line}: not CSV ({err}); quote fields as RFC 4180") from None
    if header is None:
        raise DataError(f"{path}: empty; want a header such as path,caption")
    return rows


def _check_columns(path: Path, header: list[str]) -> None:
    shown = ",".join(header)
    twice = next((name for i, name in enumerate(header) if name in header[:i]), None)
    if twice is not None:
        raise DataError(
            f"{path}:1: the header names the column {twice!r} twice (which one is meant "
            f"cannot be told); the header reads {shown!r}: rename or remove one"
        )
    if not set(header) & set(PATH_COLUMNS):
        raise DataError(
            f"{path}:1: no media path column (one of {', '.join(PATH_COLUMNS)}); the header "
            f"reads {shown!r}"
        )
    if not set(header) & set(CAPTION_COLUMNS):
        raise DataError(
            f"{path}:1: no caption column (one of {', '.join(CAPTION_COLUMNS)}); the header "
            f"reads {shown!r} (captions in NAME.txt files: give their folder as --media)"
        )


def _jsonl_rows(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    """One JSON object a line, lines ended by LF, CRLF or a lone CR (which no JSON line
    holds raw): never split at the other Unicode line breaks, which a JSON string may
    hold raw."""
    rows = []
    for number, line in numbered_lines(text):
        if not line.strip():
            continue
        row = parse_json_line(line, f"{path}:{number}")
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: want an object with path and caption")
        rows.append((f"{path}:{number}", row))
    return rows


def _json_array_rows(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    """The objects of a ``.json`` file holding one JSON array of them (as ``json.dump``
    writes a list; Hugging Face's ``json`` loader reads both forms), each named by its
    place in the array (``entry 1`` is the first)."""
    entries = parse_json_line(text, str(path), what="the file")
    rows = []
    for number, row in enumerate(entries if isinstance(entries, list) else [entries], 1):
        if not isinstance(row, dict):
            raise DataError(f"{path}: entry {number}: want an object with path and caption")
        rows.append((f"{path}: entry {number}", row))
    return rows


def _rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    text = read_text_file(path, str(path), "a UTF-8 CSV or JSONL media list")
    if path.suffix.lower() == ".csv":
        return _csv_rows(path, text)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        rows = _json_array_rows(path, text)
    else:
        rows = _jsonl_rows(path, text)
    if rows and not any(n in row for _, row in rows for n in CAPTION_COLUMNS):
        raise DataError(
            f"{path}: no line has a caption (a key {', '.join(CAPTION_COLUMNS)}); captions "
            "in NAME.txt files: give their folder as --media"
        )
    return rows


def _list_file(path: Path) -> list[MediaItem]:
    items = []
    for where, row in _rows(path):
        given = _pick(row, PATH_COLUMNS)
        if given is None:
            raise DataError(f"{where}: no media path (a column {', '.join(PATH_COLUMNS)})")
        # an empty caption cell stays "" (the caption rule skips it); no column is None
        caption = next((row[n] for n in CAPTION_COLUMNS if row.get(n) is not None), None)
        if not isinstance(given, str) or not isinstance(caption, str | None):
            raise DataError(f"{where}: the media path and caption must be strings")
        media = _inside(path.parent, given, where)
        items.append(MediaItem(len(items), media, given, caption, where))
    return items


def _caption_file(path: Path) -> str:
    """A ``NAME.txt`` caption as written, less the one line end an editor adds (LF,
    CRLF, or an old Mac editor's CR)."""
    text = read_text_file(path, str(path), "a UTF-8 caption")
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith(("\n", "\r")) else text


def _caption_files(paths: list[Path]) -> dict[Path, list[Path]]:
    """The caption files of a folder by stem: ``NAME.txt`` first, then ``NAME.TXT`` (a
    suffix in any case, as Windows and cameras write them); the first is read."""
    found: dict[Path, list[Path]] = {}
    for path in sorted(paths, key=lambda p: (p.suffix != ".txt", p)):
        if path.suffix.lower() == ".txt":
            found.setdefault(path.with_suffix(""), []).append(path)
    return found


def _unread_files(
    folder: Path, paths: list[Path], media: list[Path], captioned: dict[Path, list[Path]]
) -> dict[Path, str]:
    """The files of a ``NAME.txt`` folder that caption nothing prepare reads, and why: a
    file of another kind with its caption beside it, a caption with no file of its name,
    or a second caption of one (``NAME.txt`` and ``NAME.TXT``). Hidden files and folders
    (``.DS_Store``) and other uncaptioned files are none."""
    read, listed = {path.with_suffix("") for path in media}, set(media)
    visible = [p for p in paths if not any(n.startswith(".") for n in p.relative_to(folder).parts)]
    by_stem: dict[Path, list[Path]] = {}
    for path in visible:
        by_stem.setdefault(path.with_suffix(""), []).append(path)
    unread = {}
    captions = [p for p in visible if p.suffix.lower() == ".txt" and not p.is_dir()]
    for caption in (p for p in captions if p.with_suffix("") in read):
        first = captioned[caption.with_suffix("")][0]
        if caption != first:
            unread[caption] = f"a second caption of {first.stem}: {first.name} is read; keep one"
    for caption in (p for p in captions if p.with_suffix("") not in read):
        others = [p for p in by_stem[caption.with_suffix("")] if p != caption and p.is_file()]
        for other in others:
            kind = f"suffix {other.suffix}" if other.suffix else "no suffix"
            unread[other] = (
                f"not a clip or image prepare reads ({kind}; docs/prepare.md lists the "
                "kinds): convert it, e.g. to .mp4 or .png"
            )
        named = caption.with_suffix("")  # clip.mp4.txt beside clip.mp4
        if not others and named in listed:
            unread[caption] = (
                f"names its clip or image with its suffix: {caption.name} is read as no "
                f"caption of {named.name}; rename it {named.with_suffix('.txt').name} "
                "(NAME.txt captions NAME.mp4, NAME.png ...)"
            )
        elif not others:
            unread[caption] = (
                "a caption with no clip or image beside it (NAME.txt captions NAME.mp4, "
                "NAME.png ... in its folder)"
            )
    return unread


def _not_utf8_names(folder: Path, media: list[Path]) -> dict[Path, str]:
    """The clips and images of a folder whose names are not UTF-8, and why none is read:
    no manifest or tokenizer holds such a name (Python reads each byte that is not
    UTF-8 as the lone surrogate U+DC00 + byte)."""
    unread = {}
    for path in media:
        escape = lone_surrogate(path.relative_to(folder).as_posix())
        if escape:
            byte = int(escape[2:], 16) - 0xDC00
            unread[path] = f"its name is not UTF-8 (byte {byte:#04x}): rename it in UTF-8"
    return unread


def _with_unlisted(
    items: list[MediaItem], folder: Path, media: list[Path], listing: Path
) -> list[MediaItem]:
    """``items`` (a folder's ``metadata.jsonl``) and, after them, each clip or image of
    the folder it does not list, with the reason no sample comes of it."""
    listed = {item.path for item in items}  # resolved, as the list's paths are
    unlisted = [path for path in media if path.resolve() not in listed]
    reason = f"not listed in {listing.name}, the folder's list: add a line for it"
    return items + [
        MediaItem(len(items) + n, p, p.relative_to(folder).as_posix(), None, str(listing), reason)
        for n, p in enumerate(unlisted)
    ]


def _list_folder(folder: Path) -> list[MediaItem]:
    found = [folder / name for name in METADATA_FILES if (folder / name).exists()]
    if len(found) > 1:
        raise DataError(f"--media {folder}: holds both {', '.join(METADATA_FILES)}; keep one")
    suffixes = VIDEO_SUFFIXES + IMAGE_SUFFIXES
    paths = paths_below(folder)
    media = [p for p in paths if p.suffix.lower() in suffixes]
    if found:
        return _with_unlisted(_list_file(found[0]), folder, media, found[0])
    captioned = _caption_files(paths)
    unread = {
        **_unread_files(folder, paths, media, captioned),
        **_not_utf8_names(folder, media),
    }
    items = []
    for path in sorted({*media, *unread}):
        given = path.relative_to(folder).as_posix()
        caption_file = captioned.get(path.with_suffix(""), [path.with_suffix(".txt")])[0]
        if path in unread:  # its caption is not read: no sample comes of it
            where = path if path.suffix.lower() == ".txt" else caption_file
            items.append(MediaItem(len(items), path, given, None, str(where), unread[path]))
            continue
        caption = _caption_file(caption_file) if caption_file.exists() else None
        items.append(MediaItem(len(items), path, given, caption, str(caption_file)))
    return items


def read_media_source(source: str | Path) -> list[MediaItem]:
    """The clips and captions of a CSV/JSONL list or a folder, in order (see the module
    docstring); :class:`DataError` for a missing source or a malformed line."""
    path = Path(source).expanduser()
    if path.is_dir():
        items = _list_folder(path)
    elif path.exists() and path.suffix.lower() in (".csv", ".jsonl", ".json"):
        items = _list_file(path)  # a FIFO or device of that name is refused reading it
    elif path.exists():
        raise DataError(f"--media {source}: want a .csv or .jsonl list, or a folder")
    else:
        raise DataError(f"--media {source}: no such file or folder")
    if not items:
        raise DataError(f"--media {source}: lists no clip or image")
    if all(item.unread for item in items):
        raise DataError(
            f"--media {source}: lists no clip or image (the first file not read, "
            f"{items[0].source}: {items[0].unread})"
        )
    return items


@dataclass(frozen=True)
class MediaInfo:
    """A file's frames (1 for a still image) and its upright pixel size."""

    frames: int
    height: int
    width: int
    """Height and width as shown: after an image's EXIF orientation or a video's display
    rotation (a 90-degree turn swaps them)."""
    rotated: bool = False
    """Its pixels are stored turned or mirrored (an EXIF orientation or display rotation
    other than upright); :func:`decode` returns them upright."""
    times: tuple[Any, ...] | None = field(default=None, compare=False)
    """Every frame's timestamp in seconds (``Fraction`` where the stream has them), in
    presentation order: only when :func:`probe` is asked for them."""


@functools.cache
def _image_plugin(suffix: str) -> str:
    """Registers the Pillow plugin that reads ``suffix`` (:data:`IMAGE_PLUGINS`) when it is
    installed and Pillow lacks the format; else what to install, for the reason given
    when the image cannot be read ("" when nothing is missing)."""
    from PIL import Image

    Image.init()  # the formats Pillow reads, its installed plugins' included
    if suffix not in IMAGE_PLUGINS or suffix in Image.registered_extensions():
        return ""
    module, install = IMAGE_PLUGINS[suffix]
    try:
        plugin = importlib.import_module(module)
    except ImportError:
        return f"; Pillow reads {suffix} images with a plugin: {install}"
    if hasattr(plugin, "register_heif_opener"):  # pillow-avif-plugin registers on import
        plugin.register_heif_opener()
    return ""


def _open_image(path: Path) -> Any:
    """Pillow's (lazy) image of ``path``, through its plugin where it needs one."""
    from PIL import Image

    _image_plugin(path.suffix.lower())
    return Image.open(path)


def _unreadable_image(path: Path, err: Exception) -> MediaError:
    """The reason an image is skipped: Pillow's words, and the plugin it lacks."""
    plugin = _image_plugin(path.suffix.lower())
    return MediaError(f"unreadable image ({type(err).__name__}: {err}){plugin}")


def _sixteen_bit(image: Any) -> bool:
    """A greyscale image of 16-bit levels: Pillow's ``I;16`` modes, or ``I`` read from a
    PNG (whose greyscale is at most 16-bit; Pillow before 10 reads it so)."""
    return image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG")


def _level_problem(image: Any) -> str | None:
    """Why an image's levels cannot be shown as 8-bit RGB, or None: a 32-bit integer or
    float image (Pillow's ``I`` or ``F``) states no range its levels span."""
    if image.mode in ("I", "F") and not _sixteen_bit(image):
        kind = "floating-point" if image.mode == "F" else "32-bit integer"
        return (
            f"a {kind} image (Pillow mode {image.mode}) states no range of its levels: "
            "save it with 8 or 16 bits a level (PNG, TIFF)"
        )
    return None


def _rgb(image: Any, sixteen: bool) -> Any:
    """An RGB image of ``image``: 16-bit levels by their high byte, as Pillow reads a
    16-bit RGB PNG (its ``convert("RGB")`` clips them at 255 instead: nearly all white)."""
    from PIL import Image

    if not sixteen:
        return image.convert("RGB")
    levels = np.asarray(image).astype(np.uint32) >> 8
    return Image.fromarray(levels.astype(np.uint8), "L").convert("RGB")


def _image_orientation(image: Any) -> int:
    """The EXIF orientation tag of a Pillow image (1, upright, when it has none)."""
    try:
        return int(image.getexif().get(0x0112, 1) or 1)
    except Exception:  # noqa: BLE001 - an unreadable EXIF block is no orientation
        return 1


def _display_matrix(frame: Any) -> list[int] | None:
    """The 3 x 3 display matrix of a decoded frame (FFmpeg's ``int32`` layout), or None."""
    for data in getattr(frame, "side_data", None) or ():
        if getattr(data.type, "name", "") == "DISPLAYMATRIX" and len(bytes(data)) == 36:
            return list(np.frombuffer(bytes(data), dtype=np.int32))
    return None


def _display_turns(frame: Any, stream: Any) -> tuple[str, ...]:
    """The ``PIL.Image.Transpose`` names that show a decoded frame as players show it,
    by FFmpeg's own autorotate rule on its display matrix (rotations by a multiple of 90
    degrees and mirrors); a stream with no matrix but a ``rotate`` tag (degrees
    clockwise) is turned by that. Other angles are left as stored."""
    matrix = _display_matrix(frame)
    if matrix is None:
        try:
            clockwise = round(float(stream.metadata.get("rotate", 0))) % 360
        except ValueError:
            clockwise = 0
        return {90: ("ROTATE_270",), 180: ("ROTATE_180",), 270: ("ROTATE_90",)}.get(clockwise, ())
    clockwise = -round(getattr(frame, "rotation", 0) or 0) % 360
    if clockwise == 90:
        return ("TRANSPOSE",) if matrix[3] > 0 else ("ROTATE_270",)
    if clockwise == 270:
        return ("TRANSVERSE",) if matrix[3] < 0 else ("ROTATE_90",)
    if clockwise == 180:
        flips = (("FLIP_LEFT_RIGHT", matrix[0] < 0), ("FLIP_TOP_BOTTOM", matrix[4] < 0))
        return tuple(name for name, flip in flips if flip)
    if clockwise == 0 and matrix[4] < 0:
        return ("FLIP_TOP_BOTTOM",)
    return ()


def _pixel_aspect(stream: Any) -> Fraction:
    """The width over the height of one stored pixel of a video (its sample aspect
    ratio: 4:3 for HDV's 1440 x 1080 shown 1920 x 1080; 1 when unstated, or outside
    1/8 to 8, which no camera writes)."""
    context = getattr(stream, "codec_context", None)
    for stated in (
        getattr(stream, "sample_aspect_ratio", None),
        getattr(context, "sample_aspect_ratio", None),
    ):
        if stated and Fraction(1, 8) <= Fraction(stated) <= 8:
            return Fraction(stated)
    return Fraction(1)


def _square_width(width: int, aspect: Fraction) -> int:
    """The width of a row of ``width`` pixels of ``aspect`` in square pixels."""
    return max(1, round(width * aspect))


def _square_pixels(image: Any, aspect: Fraction) -> Any:
    """A frame of pixels of ``aspect`` resized to square pixels, as players show it
    (its width scaled, as FFmpeg's ``scale=iw*sar:ih``; Lanczos, as diffusers resizes)."""
    from PIL import Image

    if aspect == 1:
        return image
    size = (_square_width(image.width, aspect), image.height)
    return image.resize(size, Image.Resampling.LANCZOS)


def _upright(image: Any, turns: tuple[str, ...]) -> Any:
    """``image`` transposed by each of ``turns`` (``PIL.Image.Transpose`` names), exactly."""
    from PIL import Image

    for name in turns:
        image = image.transpose(Image.Transpose[name])
    return image


def _frame_time(frame: Any, number: int, stream: Any) -> Any:
    """A decoded frame's timestamp in seconds: exact (``Fraction``) from its ``pts``, or
    its number over the stream's frame rate when it has none."""
    if frame.pts is not None and frame.time_base is not None:
        return frame.pts * frame.time_base
    rate = stream.average_rate or stream.guessed_rate or 1
    return Fraction(number) / Fraction(rate)


def _open_video(path: Path) -> Any:
    """A PyAV container and its first video stream (audio and other streams, wherever
    they sit, are never decoded); :class:`MediaError` when there is no video stream."""
    import av

    container = av.open(str(path))
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["no"]
        container.close()
        raise MediaError(f"no video stream ({', '.join(kinds)} streams only)")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def _animation_frames(image: Any) -> int:
    """The frames of an image file: an animated WebP's or PNG's (APNG) all, else 1 (an
    MPO photo's second picture, a depth map or preview, is no frame of a clip)."""
    return int(getattr(image, "n_frames", 1)) if image.format in ANIMATED_FORMATS else 1


def _animation_times(image: Any, frames: int) -> tuple[Fraction, ...]:
    """Each frame's start in seconds, from the frames' durations in milliseconds (read
    once a frame is loaded; an APNG's fractions kept; a frame stating none, or 0, is
    shown 100 ms, as browsers show it)."""
    start, starts = Fraction(0), []
    for number in range(frames):
        image.seek(number)
        image.load()
        starts.append(start)
        start += Fraction(image.info.get("duration") or 100).limit_denominator(10**6) / 1000
    return tuple(starts)


def _probe_image(path: Path, times: bool) -> MediaInfo:
    """:func:`probe` of an image file: one frame, or an animation's frames."""
    try:
        with _open_image(path) as image:
            orientation = _image_orientation(image)
            h, w = image.height, image.width
            problem = _level_problem(image)
            frames = _animation_frames(image)
            stamps = _animation_times(image, frames) if times and frames > 1 else None
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
        raise _unreadable_image(path, err) from None
    if problem:
        raise MediaError(problem)
    turned = orientation in (5, 6, 7, 8)
    return MediaInfo(frames, w if turned else h, h if turned else w, orientation != 1, stamps)


def _decode_image(path: Path, indices: list[int] | None) -> list[Any]:
    """:func:`decode` of an image file: its frame (0), or an animation's at ``indices``."""
    from PIL import ImageOps

    try:
        with _open_image(path) as image:
            problem, sixteen = _level_problem(image), _sixteen_bit(image)
            frames = _animation_frames(image)
            order = list(range(frames)) if indices is None else indices
            if not problem and all(0 <= i < frames for i in order):
                pictures = []
                for number in order:
                    image.seek(number)
                    pictures.append(_rgb(ImageOps.exif_transpose(image), sixteen))
                return pictures
    except Exception as err:  # noqa: BLE001
        raise _unreadable_image(path, err) from None
    raise MediaError(problem or f"{frames} frames, frame {max(order)} wanted")


def probe(item: MediaItem, *, times: bool = False) -> MediaInfo:
    """Frames and upright size of a file; :class:`MediaError` when it cannot be read.

    A video's frame count is the stream's own when its container states one (MP4, MOV,
    AVI, GIF), else the frames that decode (Matroska and WebM keep no per-stream count);
    its size and rotation are those of its first decoded frame. With ``times``, every
    frame is decoded: the count is theirs and :attr:`MediaInfo.times` their timestamps."""
    if not item.path.is_file():
        raise MediaError("missing: no such file")
    if item.is_image:
        return _probe_image(item.path, times)
    try:
        container, stream = _open_video(item.path)
        with container:
            stated = 0 if times else int(stream.frames or 0)
            first, decoded, stamps = None, 0, []
            for frame in container.decode(stream):
                first = frame if first is None else first
                decoded += 1
                if times:
                    stamps.append(_frame_time(frame, decoded - 1, stream))
                if stated:
                    break
            if first is None:
                raise MediaError("no frame decodes (an empty or unreadable video stream)")
            turns, aspect = _display_turns(first, stream), _pixel_aspect(stream)
    except MediaError:
        raise
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt or unreadable video ({type(err).__name__}: {err})") from None
    h, w = first.height, _square_width(first.width, aspect)
    if {"TRANSPOSE", "TRANSVERSE", "ROTATE_90", "ROTATE_270"} & set(turns):
        h, w = w, h
    return MediaInfo(stated or decoded, h, w, bool(turns), tuple(stamps) if times else None)


def decode(item: MediaItem, indices: list[int] | None = None) -> list[Any]:
    """The upright RGB frames (``PIL.Image``) of ``item`` at ``indices`` (every frame if
    None): an image turned by its EXIF orientation (as ``ImageOps.exif_transpose`` and
    diffusers' ``load_image``), a video's frames by their display rotation;
    :class:`MediaError` when decoding fails or the clip is shorter than asked."""
    if item.is_image:
        return _decode_image(item.path, indices)
    wanted = None if indices is None else set(indices)
    frames: dict[int, Any] = {}
    decoded = 0
    try:
        container, stream = _open_video(item.path)
        with container:
            aspect = _pixel_aspect(stream)  # the stream's, read once
            for frame in container.decode(stream):
                if wanted is None or decoded in wanted:
                    image = _square_pixels(frame.to_image(), aspect)
                    frames[decoded] = _upright(image, _display_turns(frame, stream))
                decoded += 1
                if wanted is not None and len(frames) == len(wanted):
                    break
    except MediaError:
        raise
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt video ({type(err).__name__}: {err})") from None
    order = sorted(frames) if indices is None else indices
    if not order or any(i not in frames for i in order):
        wants = max(order) + 1 if order else 1
        raise MediaError(
            f"only {decoded} frames decode, {wants} wanted (a truncated or damaged stream)"
        )
    return [frames[i] for i in order]


@dataclass(frozen=True)
class ClipPlan:
    """The frames and pixel size a clip is encoded at: one sample, or several (windows
    of ``--frame-extraction slide`` or ``chunk``)."""

    frames: tuple[int, ...]
    """Indices of the decoded frames kept, in order (the first sample's)."""
    height: int
    width: int
    bucket: str
    rotated: bool = False
    """The file's pixels are stored turned (:attr:`MediaInfo.rotated`): decoded upright."""
    more: tuple[tuple[int, ...], ...] = ()
    """The frame indices of each further sample of the clip."""

    @property
    def windows(self) -> tuple[tuple[int, ...], ...]:
        """Every sample's frame indices, the first sample's first."""
        return (self.frames, *self.more)

    @property
    def cost(self) -> int:
        """Encoding cost: frames x pixels, over every sample."""
        return sum(len(w) for w in self.windows) * self.height * self.width


@dataclass(frozen=True)
class Geometry:
    """What a family's VAE accepts: ``temporal k + 1`` frames, sizes of ``multiple``."""

    temporal: int
    multiple: int

    def latent_frames(self, frames: int) -> int:
        """Latent frames the VAE makes of a ``frames``-frame bucket (the family's rule)."""
        return causal_latent_frames(frames, self.temporal)

    def frames_below(self, frames: int) -> int:
        """The largest accepted frame count not above ``frames`` (0 if none)."""
        return 0 if frames < 1 else (self.latent_frames(frames) - 1) * self.temporal + 1


def plan_clip(
    info: MediaInfo,
    geometry: Geometry,
    *,
    is_image: bool,
    buckets: BucketConfig | None = None,
    rng: np.random.Generator | None = None,
    sampling: FrameSampling | None = None,
) -> ClipPlan | str:
    """The :class:`ClipPlan` of a clip, or the reason it is skipped.

    A video's frames are first resampled and strided as ``sampling`` says
    (:mod:`~datacentric.data.frame_sampling`; default: every frame). Without
    ``buckets``: the clip's own size rounded down to ``geometry.multiple``
    (centre-cropped) and as many frames as the VAE accepts (at most ``max_frames``), its
    first ones. With ``buckets`` (Open-Sora's format): from the largest resolution down,
    the aspect ratio closest to the clip's, a size the clip reaches (rounded down to the
    multiple), the largest frame count it has (rounded down to an accepted count),
    sampled evenly over the clip, kept with the bucket's probability. ``sampling``'s
    ``frame_extraction`` picks other windows, several with ``slide`` and ``chunk``.
    """
    sampling = sampling or FrameSampling()
    m = geometry.multiple
    if info.height < m or info.width < m:
        return f"too small: {info.height}x{info.width} pixels, the VAE needs {m}x{m}"
    line = [0] if is_image else frame_line(info.frames, info.times, sampling)
    least = 1 if is_image else geometry.temporal + 1
    if len(line) < least:
        after = "" if len(line) == info.frames else " after --target-fps/--frame-stride"
        return f"too short: {len(line)} frames{after}, the VAE needs {least}"
    cap = len(line) if is_image else min(len(line), sampling.max_frames or len(line))
    if buckets is None:
        count = 1 if is_image else geometry.frames_below(cap)
        h, w = info.height // m * m, info.width // m * m
        return _windows(line, count, h, w, f"{count}x{h}x{w}", info, sampling, "head")
    rng = rng or np.random.default_rng(0)
    for res, sizes, probs in buckets.table:
        ratio = closest_ratio(sizes, info.height / info.width)
        h, w = (n // m * m for n in sizes[ratio])
        if info.height < h or info.width < w or min(h, w) < m:
            continue
        fits = [
            (n, p) for n, p in probs if (n == 1) == is_image and 0 < geometry.frames_below(n) <= cap
        ]
        if not fits:
            continue
        frames, keep = fits[0]
        if keep >= 1 or rng.random() < keep:
            count = geometry.frames_below(frames)
            name = f"{res}-{ratio}-{frames}f"
            return _windows(line, count, h, w, name, info, sampling, "uniform")
    return "no bucket of --bucket-config keeps it (too short, too small, or not drawn)"


def _windows(
    line: list[int],
    count: int,
    h: int,
    w: int,
    bucket: str,
    info: MediaInfo,
    sampling: FrameSampling,
    default: str,
) -> ClipPlan:
    """The plan of ``count``-frame samples of ``line`` (source frame indices)."""
    runs = window_positions(len(line), count, sampling, default)
    picked = [tuple(line[p] for p in run) for run in runs]
    return ClipPlan(picked[0], h, w, bucket, info.rotated, tuple(picked[1:]))


def clip_rng(item: MediaItem, seed: int) -> np.random.Generator:
    """The draw of a clip's bucket keep-probabilities, from its name and the seed."""
    return np.random.default_rng([int(seed), int(item.name.rsplit("-", 1)[1], 16)])
