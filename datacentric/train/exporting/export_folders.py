"""The folders ``export`` reads and writes: the run folder and the checkpoint of it to
export, the output folder and the record of an earlier export there (what ``--overwrite``
may replace: :mod:`.export`'s docstring). No torch is imported here, so that ``datacentric
export`` refuses a wrong folder in one line, and names the checkpoint it exports, before
torch loads (:func:`check_export`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from datacentric.regular_files import file_sha256, read_json_file
from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
from datacentric.train.checkpoints.checkpoint_verify import (
    find_checkpoint,
    read_trainer_record,
    resolve_resume_from,
)

#: what ``export`` writes beside the model: the run, checkpoint and files it wrote (an
#: ``--overwrite`` replaces only a folder holding one, and only those files)
EXPORT_RECORD = "datacentric_export.json"


class ExportError(ValueError):
    """A run folder that cannot be exported, or an output folder we must not replace."""


def check_export(
    run: Path,
    out: Path,
    *,
    checkpoint: str | None = None,
    overwrite: bool = False,
    expect_sha256: str | None = None,
) -> Path:
    """The checkpoint of ``run`` to export into ``out``, as found before anything loads:
    the one ``checkpoint`` (``--checkpoint``: a step or a folder) names, else the one
    ``latest`` names, else the newest, whose trainer record its manifest pins (the pin
    ``expect_sha256`` first; every file is verified when it is read). What a folder
    cannot be is refused first (:class:`ExportError`, :class:`CheckpointError`, one line
    naming it): no run folder, an ``out`` that is the run folder or holds it, a file, or
    a non-empty folder no export wrote (or one without ``overwrite``), a run with no
    checkpoint, a ``checkpoint`` the run does not hold."""
    if not run.is_dir():
        raise ExportError(f"{run}: no such run folder")
    _earlier_export(run, out, overwrite)
    if checkpoint:
        return resolve_resume_from(run, checkpoint, flag="--checkpoint")
    path, _ = find_checkpoint(run, expect_sha256, read_trainer_record)
    if path is None:
        raise CheckpointError(f"{run}: no checkpoint to export (train with --out first)")
    return path


def _earlier_export(run: Path, out: Path, overwrite: bool) -> tuple[dict[str, Path], dict]:
    """``out``'s entries and the files its export record lists with their SHA-256 (both
    empty for a new or empty folder); :class:`ExportError` for the run folder itself, a
    folder holding it, a file, a non-empty folder that no export wrote, an earlier export
    without ``overwrite``, or one that holds other files too."""
    if out.resolve() == run.resolve() or run.resolve().is_relative_to(out.resolve()):
        what = "is" if out.resolve() == run.resolve() else "holds"
        raise ExportError(
            f"--out {out} {what} the run folder {run}; export writes a folder of its own: "
            "choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; name a folder to export into")
    tree = _tree(out) if out.is_dir() else {}
    if not tree:
        return {}, {}
    written = _export_record_files(out)
    if written is None:
        raise ExportError(
            f"--out {out} exists and is not empty, and no export wrote it; choose a new --out "
            "(--overwrite replaces only an earlier export)"
        )
    if not overwrite:
        raise ExportError(
            f"--out {out} exists and is not empty (an earlier export); pass --overwrite to "
            "replace it, or choose a new --out"
        )
    others = [name for name in tree if name not in written and name != EXPORT_RECORD]
    if others:
        raise ExportError(
            f"--out {out} holds what no export wrote ({', '.join(others[:3])}); "
            "move it away or choose a new --out (nothing was deleted)"
        )
    return tree, written


def previous_export(run: Path, out: Path, overwrite: bool) -> list[Path]:
    """The files of an earlier export that ``--overwrite`` replaces in ``out`` (none for
    a new or empty folder); :class:`ExportError` as :func:`_earlier_export` says, and for
    a file the record lists whose content is no longer what export wrote."""
    tree, written = _earlier_export(run, out, overwrite)
    changed = [n for n, p in tree.items() if n in written and not _as_written(p, written[n])]
    if changed:
        raise ExportError(
            f"--out {out}: {', '.join(changed[:3])} is not the file export wrote (its SHA-256 "
            f"differs from {EXPORT_RECORD}'s, or it is a link); move it away or choose a new "
            "--out (nothing was deleted)"
        )
    return [p for n, p in tree.items() if n in written or n == EXPORT_RECORD]


def _tree(out: Path) -> dict[str, Path]:
    """Every entry of ``out`` at any depth but its real folders (files, links, a link to
    a folder, anything else), by its path relative to ``out``; links are not followed."""
    found: dict[str, Path] = {}
    for top, folders, files in os.walk(out, followlinks=False):
        here = Path(top)
        for name in files + [f for f in folders if (here / f).is_symlink()]:
            found[(here / name).relative_to(out).as_posix()] = here / name
    return dict(sorted(found.items()))


def remove_previous(out: Path, previous: list[Path]) -> None:
    """Remove an earlier export's files, then the folders they leave empty."""
    for old in previous:
        old.unlink()
    for folder in sorted({p.parent for p in previous}, key=lambda p: len(p.parts), reverse=True):
        while folder != out and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _as_written(path: Path, sha256: str) -> bool:
    """``path`` is a regular file (no link) whose SHA-256 is ``sha256``."""
    return not path.is_symlink() and path.is_file() and file_sha256(path) == sha256


def _export_record_files(out: Path) -> dict[str, str] | None:
    """The files ``out``'s export record lists, with the SHA-256 export wrote them with;
    ``None`` when it has no record, or one that is not export's own (a name that is not a
    relative path inside ``out``, a file without its SHA-256, a record of an older version
    that kept none)."""
    path = out / EXPORT_RECORD
    if path.is_symlink() or not path.is_file():
        return None
    try:
        record = read_json_file(path)
        files, hashes = record["files"], record["sha256"]
    except (OSError, ValueError, KeyError):
        return None
    if not isinstance(files, list) or not isinstance(hashes, dict):
        return None
    if not all(isinstance(f, str) for f in files) or set(files) != set(hashes):
        return None
    plain = all(
        not f.startswith("/")
        and "\\" not in f
        and all(part not in ("", ".", "..") for part in f.split("/"))
        for f in files
    )
    if not plain or not all(isinstance(h, str) and len(h) == 64 for h in hashes.values()):
        return None
    return dict(hashes)


def write_record(out: Path, run: Path, checkpoint: Path, fmt: str) -> list[str]:
    """Write ``out``'s export record: every file export wrote there with its SHA-256 (an
    ``--overwrite`` removes only these, and only while their content is unchanged);
    returns their names."""
    files = [name for name in _tree(out) if name != EXPORT_RECORD]
    hashes = {name: file_sha256(out / name) for name in files}
    record = {"run": str(run), "checkpoint": str(checkpoint), "format": fmt, "files": files}
    record["sha256"] = hashes
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return files
