"""Opening a file a folder holds without blocking on it.

A run or data folder may hold, under a name we read, something that is not a file: a
FIFO (opening it waits for a writer, forever), a socket or a device. Every such read
goes through :func:`open_regular`: the file is opened non-blocking, checked to be a
regular file on the open descriptor (so the check and the read see the same file),
and only then read; anything else is a :class:`NotRegularFileError` naming the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import IO, Any

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_FLAGS = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT}


class NotRegularFileError(OSError):
    """A path we read or append to is a FIFO, socket, device or folder, not a file."""


def kind_of(mode: int) -> str:
    """What a file mode is, in words (``a FIFO (named pipe)``, ``a regular file``)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def refusal(path: str | Path, what: str) -> NotRegularFileError:
    """The error for ``path``, which is ``what`` (a FIFO, ...) instead of a file."""
    return NotRegularFileError(
        f"{path} is {what}, not a regular file; reading it could block forever: replace it "
        "with the file it should be, or remove it"
    )


def check_regular(path: str | Path) -> None:
    """Raise :class:`NotRegularFileError` when ``path`` (links followed) exists and is not
    a regular file (a check only: the read must still go through :func:`open_regular`)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise refusal(path, kind_of(mode))


def open_regular(path: str | Path, mode: str = "r", encoding: str | None = None, **kw: Any) -> IO:
    """``open(path, mode)`` for a regular file only (``mode``: ``r``, ``rb``, ``a``,
    ``ab``): the open never blocks, and anything but a regular file is refused."""
    base = mode.replace("b", "")
    if base not in _FLAGS:
        raise ValueError(f"open_regular: mode {mode!r} is not r, rb, a or ab")
    flags = _FLAGS[base] | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno in (6, 20):  # ENXIO: a FIFO or socket with no reader; ENOTDIR
            check_regular(path)
        raise
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):
            raise refusal(path, kind_of(found))
        os.set_blocking(fd, True)
        if "b" in mode:
            return os.fdopen(fd, mode, **kw)
        return os.fdopen(fd, mode, encoding=encoding or "utf-8", **kw)
    except BaseException:
        os.close(fd)
        raise


def read_regular_text(path: str | Path, errors: str = "strict") -> str:
    """The UTF-8 text of a regular file (:func:`open_regular`)."""
    with open_regular(path, "r", errors=errors) as handle:
        return handle.read()


def read_regular_bytes(path: str | Path) -> bytes:
    """The bytes of a regular file (:func:`open_regular`)."""
    with open_regular(path, "rb") as handle:
        return handle.read()


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a regular file's bytes, read in 1 MiB pieces (:func:`open_regular`)."""
    digest = hashlib.sha256()
    with open_regular(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class FileFormatError(ValueError):
    """A file we read holds something else than it should (not UTF-8, not JSON, not the
    kind of value expected): the message names the file, and the key where one is wrong."""


def read_json_file(
    path: str | Path, expect: type = dict, error: type[Exception] = FileFormatError
) -> Any:
    """The JSON value of a regular file (:func:`open_regular`), an ``expect`` (``dict``:
    an object); anything else (not UTF-8, not JSON, nested deeper than the reader's
    stack, an integer too long to convert, another kind of value) is ``error`` with one
    line naming the file."""
    try:
        text = read_regular_text(path)
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    value = parse_json(text, str(path), error, what="the file")
    if not isinstance(value, expect):
        raise error(f"{path}: holds a JSON {json_kind(value)}, not {json_kind(expect())}")
    return value


def parse_json(
    text: str, where: str, error: type[Exception], what: str = "", *, unique_keys: bool = False
) -> Any:
    """``json.loads(text)``; anything else is ``error`` naming ``where`` (a file, a
    ``FILE:LINE``) and ``what`` it is (``the file``, ``line``; none: ``where`` says it):
    not JSON, nested deeper than the reader's stack, an integer too long to convert, and
    with ``unique_keys`` an object that names a key twice (``json.loads`` keeps the last
    value, so the other would be dropped without a word)."""
    subject = f"{what} is " if what else ""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except _RepeatedKey as err:
        raise error(
            f"{where}: {what + ' ' if what else ''}names the key {err.key!r} twice in one "
            "object; write it once (which value is meant cannot be told)"
        ) from None
    except json.JSONDecodeError as err:
        at = f": line {err.lineno} column {err.colno}" if "\n" in text.rstrip() else ""
        raise error(f"{where}: {subject}not JSON ({err.msg}{at})") from None
    except RecursionError:
        raise error(
            f"{where}: {subject}nested too deeply to read (arrays or objects inside each "
            "other thousands of times)"
        ) from None
    except ValueError as err:  # e.g. an integer of more than sys.get_int_max_str_digits()
        first = str(err).split(";")[0]
        raise error(
            f"{where}: {what + ' ' if what else ''}holds a value that cannot be read ({first})"
        ) from None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of JSON from its ``pairs``; :class:`_RepeatedKey` where a key repeats."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        raise _RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (``object``, ``array``, ``string``, ...)."""
    kinds = ((bool, "true/false"), (dict, "object"), (list, "array"), (str, "string"))
    kinds += ((int, "number"), (float, "number"))
    return next((name for cls, name in kinds if isinstance(value, cls)), "null")


def json_field(
    record: dict,
    key: str,
    expect: type | tuple[type, ...],
    path: str | Path,
    error: type[Exception] = FileFormatError,
) -> Any:
    """``record[key]``, checked to be an ``expect``; missing or another kind is ``error``
    naming ``path`` and the key."""
    if key not in record:
        raise error(f"{path}: no key {key!r} (found: {', '.join(map(str, record)) or 'none'})")
    value = record[key]
    if not isinstance(value, expect) or (isinstance(value, bool) and bool not in _types(expect)):
        raise error(f"{path}: key {key!r} holds a JSON {json_kind(value)} ({str(value)[:80]!r})")
    return value


def _types(expect: type | tuple[type, ...]) -> tuple[type, ...]:
    return expect if isinstance(expect, tuple) else (expect,)
