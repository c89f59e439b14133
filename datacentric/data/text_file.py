"""A small text file the user wrote (a media list, a caption, a prompts file), read whole
as UTF-8 (or UTF-16 when it starts with that byte-order mark, as Windows PowerShell and
Notepad write it; UTF-32 after its own): through the regular-file check (a FIFO or
device never blocks), a leading byte-order mark dropped (a spreadsheet's "CSV UTF-8"
writes one), and anything that is not text refused as one
:class:`~datacentric.data.base.DataError` naming the file.

A ``text:`` dataset's file, which may be far larger, is decoded by the same rules a piece
at a time (:func:`decoded_pieces`), without the whole text held as one string when its
UTF-8 bytes are what is wanted (:func:`text_utf8`, the UTF-8 bytes tokenizer's read).

A JSON string may spell half of a UTF-16 pair alone (``"\\ud83d"``), and a file name
that is not UTF-8 reads as such halves (Python's ``surrogateescape``): no character, and
no UTF-8 text (a tokenizer's input, a manifest) can hold one. :func:`lone_surrogate` finds
them, so that a reader names the line or file instead of failing later."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from datacentric.data.base import DataError
from datacentric.regular_files import open_regular, parse_json, read_regular_bytes

#: The encodings a text or JSONL file is read in, as a refusal names the fix.
TEXT_ENCODINGS = "UTF-8 (or UTF-16 with its byte-order mark)"


def text_codec(raw: bytes) -> str:
    """The codec of a text file's bytes: ``utf-16`` when they start with its byte-order
    mark (what Windows PowerShell's ``>`` and Notepad's "Unicode" write; the mark says
    which byte order), ``utf-32`` when they start with that one (looked for first: its
    little-endian mark starts with UTF-16's, and read as UTF-16 it is text with a NUL
    after every character), else ``utf-8``."""
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    return "utf-16" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8"


def read_text_file(path: str | Path, where: str, want: str) -> str:
    """The text of ``path``; errors start with ``where`` and say ``want`` (what the file
    should be: ``a UTF-8 CSV or JSONL list``)."""
    try:
        raw = read_regular_bytes(path)
    except OSError as err:
        raise DataError(f"{where}: cannot read it ({err.strerror or err})") from None
    codec = text_codec(raw)
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where}: not a text file (byte {err.start} is not {codec.upper()}); want {want}"
        ) from None
    if "\x00" in text:
        raise DataError(f"{where}: not a text file (it holds NUL bytes); want {want}")
    return text.removeprefix("\ufeff")


#: Bytes of a text file read at a time by :func:`text_utf8`.
TEXT_PIECE_BYTES = 1 << 24


def text_utf8(path: str) -> bytearray:
    """The UTF-8 bytes of a ``text:`` dataset's document (the text its reader,
    :mod:`datacentric.data.documents`, reads, encoded), read :data:`TEXT_PIECE_BYTES` at
    a time: memory of one piece and the bytes kept, where the text held as one string
    takes up to four bytes a character besides."""
    kept = bytearray()
    with open_regular(path, "rb") as handle:
        for text, utf8 in decoded_pieces(handle, path, TEXT_PIECE_BYTES):
            kept += text.encode("utf-8") if utf8 is None else utf8  # never a surrogate
    return kept


def decoded_pieces(handle: IO[bytes], path: str, size: int) -> Iterator[tuple[str, bytes | None]]:
    """(text, its UTF-8 bytes as read from a UTF-8 file, else None) of a text file,
    ``size`` bytes read at a time (-1: in one read): a character cut between two reads
    comes with the later one, a leading byte-order mark is dropped (a BOM an editor
    wrote; UTF-16's and UTF-32's decoders drop their own, and one more), and an error
    names its byte in the whole file."""
    codec = text_codec(handle.peek(4)[:4])
    fed, leading, last = 0, codec != "utf-8", False
    if not leading and handle.peek(3)[:3] == codecs.BOM_UTF8:
        fed = len(handle.read(3))
    decoder = codecs.getincrementaldecoder(codec)()
    while not last:
        raw = handle.read(size)
        last = not raw or size < 0  # the file's end: a cut character left is an error
        before = fed - len(decoder.buffer)  # the decoder holds a cut character's bytes
        fed += len(raw)
        try:
            text = decoder.decode(raw, final=last)
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}: not {codec.upper()} text ({err.reason} at byte "
                f"{before + err.start}); save it as {TEXT_ENCODINGS}"
            ) from None
        if leading and text:
            text, leading = text.removeprefix("\ufeff"), False
        yield text, raw if codec == "utf-8" else None


#: the line ends of a text file: LF, CRLF and an old Mac editor's lone CR
_LINE_END = re.compile(r"\r\n?|\n")


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of ``text``, split at LF, CRLF and a lone CR (none of
    which a JSON line or a one-line prompt holds raw): never at the other Unicode line
    breaks (U+2028, U+0085, ...), which a caption or a JSON string may hold raw and which
    ``str.splitlines`` would cut at."""
    yield from enumerate(_LINE_END.split(text), 1)


#: a JSON escape of a UTF-16 surrogate (U+D800 to U+DFFF): only a line with one can hold
#: a lone half once parsed
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(text: str) -> str | None:
    """The first lone UTF-16 surrogate of ``text`` as its escape (``\\ud83d``), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"\\u{ord(text[err.start]):04x}"
    return None


def _json_lone_surrogate(line: str, value: Any) -> str | None:
    """:func:`lone_surrogate` of any string in ``value``, parsed from the JSON ``line``
    (only a line holding a surrogate's escape is looked into)."""
    if not _SURROGATE_ESCAPE.search(line):
        return None
    return lone_surrogate(json.dumps(value, ensure_ascii=False))


def _surrogate_problem(escape: str) -> str:
    """Why a string holding the lone surrogate ``escape`` is refused, and the fix."""
    return (
        f"holds {escape}, half of a UTF-16 surrogate pair without its other half: no "
        "character, and UTF-8 cannot hold it; write the character itself, or both halves "
        "of its pair (\\ud83d\\udc31)"
    )


def parse_json_line(line: str, where: str, what: str = "", hint: str = "") -> Any:
    """The value of a JSON line (or file) a user wrote: a media list's, a JSONL record's,
    a prompt's, a latent manifest's. :class:`~datacentric.data.base.DataError` naming
    ``where`` when it is not JSON (followed by ``hint``, when given) or a string in it
    holds half of a UTF-16 surrogate pair (:func:`lone_surrogate`) or an object in it names
    a key twice (``json.loads`` would keep one value and drop the other)."""
    try:
        value = parse_json(line, where, DataError, what=what, unique_keys=True)
    except DataError as err:
        if not hint:
            raise
        raise DataError(f"{err}; {hint}") from None
    escape = _json_lone_surrogate(line, value)
    if escape:
        raise DataError(f"{where}: {_surrogate_problem(escape)}")
    return value
