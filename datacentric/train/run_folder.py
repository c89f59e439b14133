"""What a training run leaves for later readers besides metrics and checkpoints.

- ``schedules/epoch-N.json``: the schedule epoch ``N`` ran (``Schedule.to_json``),
  written once per epoch by rank 0, atomically. An epoch re-planned mid-way for a
  new world size on resume runs a second schedule: it is stored as
  ``schedules/epoch-N-step-S.json``, ``S`` being the run's step where it began.
- whose run a folder holds (:func:`claim_run_folder`): a fresh run refuses a folder
  that holds another run unless it resumes it or is told to overwrite it.
- who writes it now (:class:`RunFolderLock`): one process at a time, fresh run or
  resume, holds an exclusive ``fcntl`` lock on ``.datacentric.lock`` (the file names the
  holder's host and pid); the kernel drops it when the holder dies, so a crashed run
  never leaves a stale lock behind.

Comparisons read the schedules back (:func:`load_schedule`) rather than rebuilding them
(and each step's timeline: :mod:`datacentric.train.reporting.timeline`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Any

from datacentric.schedule import Schedule
from datacentric.settings.sections import CheckpointConfig, JobConfig

SCHEDULES = "schedules"
#: What a run writes into its folder; any of them means the folder holds a run.
RUN_FILES = ("config.json", "metrics.jsonl", "samples.jsonl", "checkpoints")
#: What ``overwrite`` removes (a shared ``profile/`` stays: it is a cache).
RUN_OUTPUTS = (*RUN_FILES, "config.toml", "plan.json", SCHEDULES)
#: What else a run writes into its folder (never through a link: see claim_run_folder).
RUN_WRITES = ("plots", "tb", "traces")


LOCK_FILE = ".datacentric.lock"
#: what opening the lock path without following links finds there instead of a file
_NOT_A_FILE = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a folder", errno.ENXIO: "a socket"}


class RunFolderError(ValueError):
    """The run folder holds another run and the settings do not say what to do with it."""


class RunFolderLock:
    """The exclusive right to write a run folder (a context manager; see the module doc).

    ``acquire`` creates the folder if needed and raises :class:`RunFolderError` naming
    the holder when another process holds it; ``release`` removes the lock file."""

    def __init__(self, out: str | Path) -> None:
        self.path = Path(out) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunFolderLock:
        out = self.path.parent
        if out.exists() and not out.is_dir():
            raise RunFolderError(f"--out {out} is a file; name a folder for the run")
        while True:
            try:
                out.mkdir(parents=True, exist_ok=True)
                # never through a symbolic link: it would have us overwrite its target
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                if err.errno in _NOT_A_FILE:
                    raise self._not_ours(_NOT_A_FILE[err.errno]) from None
                raise RunFolderError(
                    f"--out {out} cannot be written ({err.strerror}); choose another --out"
                ) from None
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
                os.close(fd)
                raise self._not_ours(
                    "not a regular file"
                    if not stat.S_ISREG(found.st_mode)
                    else f"a file with {found.st_nlink} names (a hard link)"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderError(
                    f"--out {self.path.parent} is being written by another run "
                    f"({self._holder()}); wait for it to finish, or choose another --out"
                ) from None
            # The holder before us may have removed the file after we opened it: the lock
            # counts only on the file that is still at the path.
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode())
        self._fd = fd
        return self

    def _not_ours(self, what: str) -> RunFolderError:
        """The error for a lock path that holds something other than our lock file
        (writing it would change what it links to)."""
        return RunFolderError(
            f"--out {self.path.parent}: {self.path} is {what}, not a lock file of "
            "datacentric; nothing was written to it: remove it, or choose another --out"
        )

    def _holder(self) -> str:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        return text or "a process that has not written its name yet"

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def claim_run_folder(job: JobConfig, checkpoint: CheckpointConfig, restarted: bool = False) -> None:
    """Make ``job.out`` this run's (the ``[job]`` and ``[checkpoint]`` sections): fine when
    empty or when resuming (``resume``, ``resume_from`` or a torchrun restart); cleared
    first with ``overwrite``; else :class:`RunFolderError`. Call once, before the run
    writes anything."""
    out = Path(job.out)
    found = [name for name in RUN_FILES if (out / name).exists()]
    resuming = bool(checkpoint.resume or checkpoint.resume_from or restarted)
    cleared = job.overwrite and not resuming
    names = RUN_WRITES if cleared else (*RUN_OUTPUTS, *RUN_WRITES)  # cleared: links removed
    linked = [name for name in names if (out / name).is_symlink()]
    if linked:
        raise RunFolderError(
            f"--out {out}: {out / linked[0]} is a symbolic link, and a run writes there "
            "(it would write through the link); remove it, or choose another --out"
        )
    if not found or resuming:
        return
    if not job.overwrite:
        raise RunFolderError(
            f"--out {out} already holds a run ({', '.join(found)}); pass --resume to "
            "continue it, --overwrite to replace it, or choose another --out"
        )
    for name in RUN_OUTPUTS:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()  # a link goes, never what it points to
    for marker in out.glob(".fault-injected-*"):
        marker.unlink()


def schedule_path(out_dir: str | Path, epoch: int, first_step: int | None = None) -> Path:
    """Where the schedule of ``epoch`` is stored (``first_step``: a re-planned segment)."""
    suffix = "" if first_step is None else f"-step-{first_step}"
    return Path(out_dir) / SCHEDULES / f"epoch-{epoch}{suffix}.json"


def save_schedule(out_dir: str | Path, schedule: Schedule, first_step: int | None = None) -> Path:
    """Write ``schedule`` under ``out_dir/schedules`` atomically; returns the path."""
    path = schedule_path(out_dir, schedule.epoch, first_step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a link left there is removed, never written through
    tmp.write_text(json.dumps(schedule.to_json()), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_schedule(out_dir: str | Path, epoch: int = 0) -> Schedule:
    """The schedule epoch ``epoch`` of the run in ``out_dir`` ran."""
    path = schedule_path(out_dir, epoch)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: the run did not start epoch {epoch}")
    return Schedule.load(str(path))
