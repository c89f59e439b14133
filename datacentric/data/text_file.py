"""A small text file the user wrote (a media list, a caption, a prompts file), read whole
as UTF-8: through the regular-file check (a FIFO or device never blocks), a leading
byte-order mark dropped (a spreadsheet's "CSV UTF-8" writes one), and anything that is
not text refused as one :class:`~datacentric.data.base.DataError` naming the file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from datacentric.data.base import DataError
from datacentric.regular_files import read_regular_bytes


def read_text_file(path: str | Path, where: str, want: str) -> str:
    """The text of ``path``; errors start with ``where`` and say ``want`` (what the file
    should be: ``a UTF-8 CSV or JSONL list``)."""
    try:
        raw = read_regular_bytes(path)
    except OSError as err:
        raise DataError(f"{where}: cannot read it ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where}: not a text file (byte {err.start} is not UTF-8); want {want}"
        ) from None
    if "\x00" in text:
        raise DataError(f"{where}: not a text file (it holds NUL bytes); want {want}")
    return text.removeprefix("\ufeff")


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of ``text``, split at LF only (a CR before it dropped):
    never at the other Unicode line breaks (U+2028, U+0085, ...), which a caption or a
    JSON string may hold raw and which ``str.splitlines`` would cut at."""
    for number, line in enumerate(text.split("\n"), 1):
        yield number, line.removesuffix("\r")
