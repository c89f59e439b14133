"""Opening a file a folder holds without blocking on it.

A run or data folder may hold, under a name we read, something that is not a file: a
FIFO (opening it waits for a writer, forever), a socket or a device. Every such read
goes through :func:`open_regular`: the file is opened non-blocking, checked to be a
regular file on the open descriptor (so the check and the read see the same file),
and only then read; anything else is a :class:`NotRegularFileError` naming the path.
"""

from __future__ import annotations

import hashlib
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
