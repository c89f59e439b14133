"""Which clips and images a media source lists for ``datacentric prepare``, and their
captions (:func:`read_media_source`). How each file is read is
:mod:`datacentric.data.media_decode`; the frames and size it is encoded at,
:mod:`datacentric.data.clip_plans`.

- Sources: a CSV or JSONL file (or a ``.json`` file of
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
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datacentric.data.base import DataError
from datacentric.data.documents import paths_below
from datacentric.data.text_file import (
    lone_surrogate,
    numbered_lines,
    parse_json_line,
    read_text_file,
)

#: a folder's clips, by suffix: the containers the installed PyAV's FFmpeg reads (each
#: written and read back in tests/runtime/data/test_media_kinds.py)
VIDEO_SUFFIXES = (
    *(".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".gif"),
    *(".3gp", ".3g2", ".mpg", ".mpeg", ".m2v", ".vob", ".ts", ".mts", ".m2ts"),
    *(".wmv", ".asf", ".flv", ".f4v", ".ogv", ".mxf"),
    *(".qt", ".y4m", ".ivf"),  # QuickTime's older suffix; YUV4MPEG; VP8/VP9/AV1 in IVF
)
#: a folder's images: what Pillow reads (HEIC/HEIF with the pillow-heif plugin, AVIF with
#: a Pillow built with libavif or the pillow-avif-plugin:
#: :data:`~datacentric.data.media_decode.IMAGE_PLUGINS`)
IMAGE_SUFFIXES = (
    *(".png", ".jpg", ".jpeg", ".webp", ".bmp"),
    *(".tif", ".tiff", ".avif", ".heic", ".heif"),
    *(".jfif", ".jpe", ".apng"),  # JPEGs as browsers save them on Windows; animated PNG
    ".avifs",  # an AVIF image sequence (an animation)
)
PATH_COLUMNS = ("path", "video", "file", "image", "file_name")
#: Hugging Face's ``imagefolder`` / ``videofolder`` list, read when a folder holds one
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
CAPTION_COLUMNS = ("caption", "text", "prompt")


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
    inside = path.is_relative_to(folder.resolve())
    if Path(given).is_absolute() and inside:  # as Open-Sora's lists hold them
        relative = path.relative_to(folder.resolve()).as_posix()
        raise DataError(
            f"{where}: path {given!r} is absolute; paths in a media list are relative to "
            f"the list's folder {folder.resolve()}: write it as {relative!r}"
        )
    if Path(given).is_absolute() or not inside:
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
