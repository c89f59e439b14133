"""Text documents read from files: JSONL, Parquet, plain text, or a saved Hugging Face
``datasets`` dataset.

Every reader yields :class:`Document` (the text and where it came from, for error
messages) in a fixed order: files sorted by path, then line / row order. Nothing
is downloaded: Parquet needs the optional ``pyarrow`` and saved datasets the optional
``datasets`` package (``pip install 'datacentric[data]'``).
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from datacentric.data.base import DataError
from datacentric.data.text_file import TEXT_ENCODINGS, decoded_pieces, parse_json_line, text_codec
from datacentric.regular_files import (
    check_regular,
    json_kind,
    open_regular,
)

#: File name endings that a folder given as ``jsonl:DIR`` (etc.) is searched for.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".json"),
    "parquet": (".parquet",),
    "text": (".txt", ".md"),
}

#: Parquet rows read at a time (bounds memory on large files).
PARQUET_BATCH_ROWS = 4096


@dataclass(frozen=True)
class Document:
    """One document's text and origin: file index and line (JSONL, 1-based) or row (0-based)."""

    text: str
    file: int
    row: int


def require(module: str, extra: str = "data"):
    """Import an optional dependency, or fail with one line naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(
            f"this dataset needs the {module!r} package: pip install 'datacentric[{extra}]'"
        ) from None


#: the name macOS gives a file's AppleDouble companion (``._NAME``: its Finder metadata,
#: written beside every file a Mac copies to a FAT, exFAT or network volume and into a
#: zip's ``__MACOSX/``): binary, never a document, clip, image, caption or latent
APPLE_DOUBLE = "._"


def paths_below(folder: Path) -> list[Path]:
    """Every file and folder below ``folder``, sorted, symlinked folders' contents too (a
    shard of data linked in; ``Path.rglob`` before Python 3.13 does not enter them):
    each real folder once, and never ``folder`` or one above it (a link back is a loop).
    macOS's AppleDouble files (:data:`APPLE_DOUBLE`) are left out."""
    root = folder.resolve()
    found, seen, todo = [], {root}, [folder]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # an unreadable folder, as rglob passes it
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith(APPLE_DOUBLE) and entry.is_file():
                continue
            found.append(path)
            real = path.resolve() if entry.is_dir() else None  # links followed
            if real is not None and real not in seen and not root.is_relative_to(real):
                seen.add(real)
                todo.append(path)
    return sorted(found)


def resolve_files(kind: str, pattern: str) -> list[str]:
    """Sorted files of ``PATH``, ``GLOB`` or a folder (searched recursively for
    :data:`EXTENSIONS` of ``kind``, in any case: ``NOTES.TXT`` too); an empty result is a
    :class:`DataError`."""
    if not pattern:
        raise DataError(f"{kind}: give a file, glob or folder after '{kind}:'")
    path = Path(pattern).expanduser()
    if path.is_dir():
        ends = EXTENSIONS.get(kind, ())
        found = paths_below(path)
        files = sorted(str(p) for p in found if p.is_file() and p.name.lower().endswith(ends))
        if not files:
            raise DataError(f"{kind}:{pattern}: folder has no {'/'.join(ends)} file")
        return files
    files = sorted(f for f in glob.glob(str(path), recursive=True) if os.path.isfile(f))
    if not files:
        raise DataError(f"{kind}:{pattern}: no file matches (check the path or glob)")
    return files


def read_documents(kind: str, files: list[str], text_field: str) -> Iterator[Document]:
    """Every document of ``files`` in order (``kind``: jsonl, parquet, text, hf-datasets)."""
    for index, path in enumerate(files):
        if kind == "text":
            yield Document(text=_text(path), file=index, row=0)
            continue
        for row, record in _READERS[kind](path, [text_field]):
            yield Document(
                text=_field(record, text_field, _where(kind, path, row)), file=index, row=row
            )


def read_records(kind: str, files: list[str]) -> Iterator[Record]:
    """Every record (row) of ``files`` in order, with all its fields (``kind``: jsonl,
    parquet or hf-datasets; conversations are records, see :mod:`datacentric.data.chat`)."""
    if kind not in _READERS:
        raise DataError(
            f"{kind}: holds plain text, not records; use jsonl:, parquet: or hf-datasets:"
        )
    for index, path in enumerate(files):
        for row, record in _READERS[kind](path, None):
            where = _where(kind, path, row)
            yield Record(fields=record, file=index, row=row, where=where, columnar=kind != "jsonl")


#: The loss rules of a text dataset (``--loss-on``; :func:`loss_rule`).
LOSS_ON = ("assistant", "all")
#: The field of a pre-tokenized record that holds its token ids.
TOKEN_FIELD = "input_ids"


def is_conversation(fields: object) -> bool:
    """Whether a record is a conversation (``messages``, or ``prompt`` and ``completion``)."""
    return isinstance(fields, dict) and (
        "messages" in fields or ("prompt" in fields and "completion" in fields)
    )


def first_record(kind: str, files: list[str]) -> Record | None:
    """The first record of ``files``, past files that hold none (an empty JSONL file, a
    Parquet file of no rows); None when none does or ``kind`` is plain text."""
    return None if kind == "text" else next(read_records(kind, files), None)


def record_format(first: Record | None, text_field: str) -> str:
    """What the records of a dataset hold, read off its first (:func:`first_record`, read
    once by the caller, which also names its file): ``"tokens"`` when it holds
    ``input_ids`` (pre-tokenized), ``"chat"`` when it is a conversation without
    ``text_field``, else ``"text"`` (plain text files, which have no record, always; a
    JSONL line that holds no object, refused as such when read as text)."""
    fields = first.fields if first is not None and isinstance(first.fields, dict) else None
    if fields is not None and TOKEN_FIELD in fields and text_field not in fields:
        return "tokens"
    if fields is None or text_field in fields or not is_conversation(fields):
        return "text"
    return "chat"


def loss_rule(loss_on: str | None, fmt: str, source: str) -> str:
    """The loss rule of a dataset: ``assistant`` for conversations, ``all`` for text,
    unless set; ``assistant`` on text records is refused (they have no turns)."""
    if loss_on is None:  # pre-tokenized records: the tokens their masks mark
        return "assistant" if fmt in ("chat", "tokens") else "all"
    if loss_on not in LOSS_ON:
        raise DataError(f"--loss-on {loss_on!r}: use one of {', '.join(LOSS_ON)}")
    if loss_on == "assistant" and fmt == "text":
        raise DataError(
            f"--loss-on assistant: {source} holds text records, not conversations (no "
            "messages field), so there is no assistant turn; pass --loss-on all"
        )
    return loss_on


@dataclass(frozen=True)
class Record:
    """One record's fields and origin (``where``: ``FILE:LINE`` or ``FILE row R``)."""

    fields: dict
    file: int
    row: int
    where: str
    columnar: bool = False
    """Read from a table (Parquet, a saved ``datasets`` folder): its columns give every
    record, and every nested mapping of a column, the same keys, ``None`` where the
    record has none."""


def _where(kind: str, path: str, row: int) -> str:
    return f"{path}:{row}" if kind == "jsonl" else f"{path} row {row}"


def _kind(value: object) -> str:
    """What a JSONL value or a table cell is, in JSON's words (``null``, ``an array``;
    a table's own types, a date or a decimal, by name)."""
    if value is None:
        return "null"
    kind = json_kind(value)
    if kind == "null":  # no JSON value: a table's own type
        kind = type(value).__name__
    return kind if kind == "true/false" else ("an " if kind[0] in "aeiou" else "a ") + kind


def _field(value: object, field: str, where: str) -> str:
    """The text of ``value``'s ``field``: a string, or the bytes of a binary table column
    read as UTF-8 (Impala, Hive and older Spark write strings so)."""
    if isinstance(value, dict) and isinstance(value.get(field), bytes):
        try:
            return value[field].decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{where}: field {field!r} is binary and not UTF-8 text ({err.reason} at "
                f"byte {err.start}); write the column as UTF-8 strings"
            ) from None
    if isinstance(value, dict) and field in value and not isinstance(value[field], str):
        raise DataError(
            f"{where}: field {field!r} is {_kind(value[field])}, not a string; give every "
            "record its text as a string, or leave the record out"
        )
    if is_conversation(value) and field not in value:
        raise DataError(
            f"{where}: a conversation (messages, or prompt and completion), though the first "
            f"record of the dataset is text (field {field!r}); keep conversations and text "
            "in datasets of their own"
        )
    if not isinstance(value, dict):
        raise DataError(
            f"{where}: {_kind(value)}, not an object; JSONL holds one object per line (a "
            "file of one JSON array: write each of its objects on a line of its own)"
        )
    if not isinstance(value.get(field), str):
        keys, fix = ", ".join(sorted(value)), _FIXES["conversations" in value]
        raise DataError(f"{where}: no string field {field!r} (found: {keys}); {fix}")
    return value[field]


#: The fix for records without the text field, by the fields they have: ShareGPT's
#: turns, which a user may take for a field to name (a key ``conversations``), else
#: ``--text-field``.
_FIXES = {
    True: "ShareGPT's conversations (turns of from and value) are not read: write them as "
    "messages (turns of role and content, human as user and gpt as assistant)",
    False: "pass --text-field NAME",
}


def _jsonl(path: str, columns: list[str] | None) -> Iterator[tuple[int, object]]:
    """(line number, value) of every JSON line of ``path``: UTF-8, or UTF-16 or UTF-32
    after its byte-order mark (as text files), split at LF only (a JSON string may hold
    U+2028 raw)."""
    with open_regular(path, "rb") as handle:
        codec = text_codec(handle.peek(4)[:4])
        text = None if codec == "utf-8" else io.TextIOWrapper(handle, encoding=codec, newline="\n")
        with text or contextlib.nullcontext():  # the reader closed before the file
            lines = _utf8_lines(handle, path) if text is None else _lines_of(text, path)
            yield from _json_lines(lines, path)


def _json_lines(lines: Iterator[tuple[int, str]], path: str) -> Iterator[tuple[int, object]]:
    """(line number, value) of every line that is not blank."""
    for number, line in lines:
        # a byte-order mark an editor wrote, as text files may start: before a later line
        # where files so written were joined (cat a.jsonl b.jsonl); no JSON value holds it
        line = line.removeprefix("\ufeff")
        if not line.strip():
            continue  # a blank line (e.g. at the end) holds no document
        yield number, _json_line(line, f"{path}:{number}")


def _utf8_lines(handle: IO[bytes], path: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(handle, start=1):
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}:{number}: line is not UTF-8 text ({err.reason} at byte {err.start} "
                f"of the line); save the file as {TEXT_ENCODINGS}"
            ) from None


def _lines_of(text: io.TextIOWrapper, path: str) -> Iterator[tuple[int, str]]:
    """The lines of a file read in UTF-16 or UTF-32 (``text``), split at LF only."""
    number = 0
    while True:
        try:
            line = text.readline()
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}:{number + 1}: line is not {text.encoding.upper()} text "
                f"({err.reason}); save the file as {TEXT_ENCODINGS}"
            ) from None
        if not line:
            return
        number += 1
        yield number, line


def _json_line(line: str, where: str) -> object:
    """One JSONL line's value; :class:`DataError` naming ``where`` for anything else
    (not JSON, nested deeper than the reader's stack, an integer too long to convert, a
    string holding half of a UTF-16 pair: no tokenizer encodes it); a line that only
    opens an array or object is a JSON document spread over lines, which the refusal
    says."""
    spread = line.strip() in ("[", "{")
    return parse_json_line(line, where, what="line", hint=_SPREAD if spread else "")


#: The fix for a JSON document spread over lines (a pretty-printed ``.json`` file).
_SPREAD = (
    "JSONL holds one object per line, and this line only opens a JSON document spread "
    "over lines: write each record on a line of its own"
)


def _parquet(path: str, columns: list[str] | None) -> Iterator[tuple[int, object]]:
    pq = require("pyarrow.parquet")
    check_regular(path)  # pyarrow's own open would block on a FIFO
    try:
        handle = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    names = handle.schema_arrow.names
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # a row as a mapping would keep one of them
        raise DataError(
            f"{path}: names the column {twice!r} twice; rename or drop one (which holds "
            "the records' values cannot be told)"
        )
    missing = [c for c in columns or () if c not in names]
    if missing:
        fix = _FIXES["conversations" in names]
        raise DataError(f"{path}: no column {missing[0]!r} (found: {', '.join(names)}); {fix}")
    row = 0
    batches = handle.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns)
    while True:
        try:  # a corrupt page or column chunk fails here, not when the file opens
            records = next(batches).to_pylist()
        except StopIteration:
            return
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types
            raise DataError(f"{path}: not a readable Parquet file from row {row} ({err})") from None
        for record in records:
            yield row, record
            row += 1


def _text(path: str) -> str:
    """A text file's document, every byte as written: its CRLF and CR line ends kept (a
    text-mode read turns both into LF), a leading byte-order mark dropped; UTF-8, or
    UTF-16 or UTF-32 when it starts with that one's mark
    (:func:`~datacentric.data.text_file.decoded_pieces`). Read whole: a tokenizer takes
    the document as one string."""
    with open_regular(path, "rb") as handle:
        return "".join(text for text, _ in decoded_pieces(handle, path, -1))


def _hf_datasets(path: str, columns: list[str] | None) -> Iterator[tuple[int, object]]:
    datasets = require("datasets")
    try:
        data = datasets.load_from_disk(path)
    except Exception as err:  # not a saved dataset folder
        raise DataError(f"{path}: not a dataset saved with save_to_disk ({err})") from None
    if isinstance(data, datasets.DatasetDict):
        raise DataError(f"{path}: holds splits {', '.join(data)}; pass the folder of one split")
    missing = [c for c in columns or () if c not in data.column_names]
    if missing:
        raise DataError(
            f"{path}: no column {missing[0]!r} (found: {', '.join(data.column_names)}); "
            f"{_FIXES['conversations' in data.column_names]}"
        )
    if columns:
        data = data.select_columns(columns)
    data = data.with_format(None)  # rows as Python values, whatever format it was saved with
    row = 0
    for batch in data.iter(batch_size=PARQUET_BATCH_ROWS):
        for values in zip(*batch.values()):
            yield row, dict(zip(batch.keys(), values))
            row += 1


_READERS = {"jsonl": _jsonl, "parquet": _parquet, "hf-datasets": _hf_datasets}
