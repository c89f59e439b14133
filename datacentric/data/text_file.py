"""A small text file the user wrote (a media list, a caption, a prompts file), read whole
as UTF-8: through the regular-file check (a FIFO or device never blocks), a leading
byte-order mark dropped (a spreadsheet's "CSV UTF-8" writes one), and anything that is
not text refused as one :class:`~datacentric.data.base.DataError` naming the file."""

from __future__ import annotations

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
