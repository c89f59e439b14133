"""Which checkpoint a run trusts: every file checked against the manifest's SHA-256
(:func:`verify_checkpoint`; the trainer's record alone, :func:`read_trainer_record`), the
manifest pinned by ``expect_sha256`` before any other file is opened, and the checkpoint
``latest`` names, else the newest that verifies (:func:`find_checkpoint`), or the one
``--resume-from`` names (:func:`resolve_resume_from`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from datacentric.log import get_logger
from datacentric.regular_files import file_sha256, read_json_file, read_regular_text
from datacentric.train.checkpoints.checkpoint_folders import (
    MANIFEST,
    REFUSED_FILE,
    REFUSED_REASON,
    TRAINER_FILE,
    CheckpointError,
    _inside,
    _plain_name,
    checkpoint_dir,
    checkpoint_step,
    is_refused,
    list_checkpoints,
    named_checkpoints,
)


def _sha256(path: Path) -> str:
    return file_sha256(path)


def latest_checkpoint(run_dir: str | Path, expect_sha256: str | None = None) -> Path | None:
    """The newest valid checkpoint of a run, or ``None`` if it has none (see
    :func:`find_checkpoint`; its notice goes to stderr)."""
    path, notice = find_checkpoint(run_dir, expect_sha256)
    if notice:
        get_logger().warning("datacentric: note: %s", notice)
    return path


def find_checkpoint(
    run_dir: str | Path,
    expect_sha256: str | None = None,
    verify: Callable[[Path, str | None], Any] | None = None,
) -> tuple[Path | None, str | None]:
    """``(checkpoint, notice)``: the one ``latest`` names if it verifies, else the
    newest checkpoint that does (the notice says why and which); ``(None, None)``
    when the run has no checkpoint; :class:`CheckpointError` when none is valid.
    ``expect_sha256``: a checkpoint verifies only with that manifest (checked first).
    ``verify(path, expect_sha256)``: how a checkpoint is verified (default
    :func:`verify_checkpoint`, every file; :func:`read_trainer_record` reads its record
    alone, for a check that loads nothing)."""
    verify = verify or verify_checkpoint
    root = checkpoint_dir(run_dir)
    pointer = root / "latest"
    candidates = list_checkpoints(run_dir)
    if not pointer.exists() and not candidates:
        return None, None
    problem = None
    if pointer.exists():
        named = _named_by_latest(root, pointer)
        try:
            if not named.is_dir():
                raise CheckpointError(f"{pointer} names {named.name}, which does not exist")
            if is_refused(named):
                raise CheckpointError(f"{pointer} names {named.name}, {REFUSED_REASON}")
            verify(named, expect_sha256)
            return named, None
        except CheckpointError as err:
            problem = str(err)
    else:
        problem = f"{pointer} is missing"
    refused = [p.name for p in candidates if is_refused(p)]
    if refused:
        problem += (
            f"; passing over {named_checkpoints(refused)}, marked {REFUSED_FILE} (delete the "
            "file to resume from one anyway)"
        )
    for path in reversed([p for p in candidates if not is_refused(p)]):
        try:
            verify(path, expect_sha256)
        except CheckpointError:
            continue
        return path, f"{problem}; using {path.name}, the newest valid checkpoint"
    raise CheckpointError(f"{problem}; and {root} holds no other valid checkpoint")


def _named_by_latest(root: Path, pointer: Path) -> Path:
    """The folder ``latest`` names; :class:`CheckpointError` (no fallback: the folder was
    altered) when it leads out of the run (a path, ``..``, a link)."""
    if not _inside(pointer, root):
        raise CheckpointError(f"{pointer} links outside {root}; a checkpoint pointer is a file")
    name = read_regular_text(pointer).strip()
    named = root / name
    if not _plain_name(name) or named.is_symlink() or not _inside(named, root):
        raise CheckpointError(
            f"{pointer} names {name[:200]!r}, which leads outside {root}; the run folder was "
            "altered: restore it, or name a checkpoint of the run with --resume-from"
        )
    return named


def resolve_resume_from(run_dir: str | Path, spec: str, flag: str = "--resume-from") -> Path:
    """The checkpoint ``--resume-from`` (``flag``: the setting named in a refusal) names:
    a folder, or a step number of ``run_dir``."""
    if spec.isdigit():
        matches = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) == int(spec)]
        if not matches:
            steps = sorted({checkpoint_step(p) for p in list_checkpoints(run_dir)})
            raise CheckpointError(
                f"{flag} {spec}: {checkpoint_dir(run_dir)} has no checkpoint of step "
                f"{spec} (it has steps {steps or 'none'})"
            )
        return matches[-1]
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"{flag} {spec}: no such checkpoint folder")
    return path


def manifest_sha256(path: str | Path) -> str:
    """SHA-256 of a checkpoint's ``manifest.json``: it pins every file of the checkpoint
    (the manifest holds their SHA-256), so it identifies the checkpoint's content."""
    manifest = Path(path) / MANIFEST
    if not manifest.exists():
        raise CheckpointError(f"{path} has no {MANIFEST}: the checkpoint is incomplete")
    return _sha256(manifest)


def verify_checkpoint(path: str | Path, expect_sha256: str | None = None) -> dict[str, Any]:
    """Check every file against the manifest; return the trainer state.

    ``expect_sha256``: the manifest's SHA-256 must be this (checked first, before any
    other file of the checkpoint is opened). Every file the manifest names, and every
    shard ``.metadata`` names, must be a file of the manifest inside the folder, so the
    manifest (and a pin of it) covers everything a load reads."""
    path = Path(path)
    _check_pin(path, expect_sha256)
    manifest = read_manifest(path)
    for name, expected in manifest.items():
        _check_file(path, name, expected)
    _check_shard_paths(path, manifest)
    return read_json_file(path / TRAINER_FILE, error=CheckpointError)


def read_trainer_record(path: str | Path, expect_sha256: str | None = None) -> dict[str, Any]:
    """A checkpoint's trainer state (``trainer.json``) checked as :func:`verify_checkpoint`
    checks it (the pin ``expect_sha256`` first, then its SHA-256 in the manifest),
    without reading the checkpoint's other files: what a check before the ranks start
    reads of it."""
    path = Path(path)
    _check_pin(path, expect_sha256)
    _check_file(path, TRAINER_FILE, read_manifest(path)[TRAINER_FILE])
    return read_json_file(path / TRAINER_FILE, error=CheckpointError)


def _check_pin(path: Path, expect_sha256: str | None) -> None:
    """The manifest's SHA-256 is ``expect_sha256`` (None: not pinned), before any other
    file of the checkpoint is opened."""
    if expect_sha256 is not None:
        found = manifest_sha256(path)
        if found != expect_sha256.strip().lower():
            raise CheckpointError(
                f"{path / MANIFEST}: SHA-256 is {found}, --expect-sha256 says {expect_sha256}; "
                "this is not the checkpoint you meant to trust (nothing in it was read)"
            )


def _check_file(path: Path, name: str, expected: str) -> None:
    """The checkpoint's file ``name`` is there and has the SHA-256 its manifest says."""
    file = path / name
    if not file.exists():
        raise CheckpointError(f"{path}: {name} is missing")
    if _sha256(file) != expected:
        earlier = [p for p in list_checkpoints(path.parent.parent) if p.name < path.name]
        hint = (
            f"resume from an earlier one with `datacentric train --resume-from {earlier[-1]} ...`"
            if earlier
            else "restore it, or start the run again with --overwrite"
        )
        raise CheckpointError(
            f"{path}: checksum mismatch for {name}; the checkpoint is corrupt: {hint}"
        )


def read_manifest(path: str | Path) -> dict[str, str]:
    """A checkpoint's manifest (file name -> SHA-256), every name a file inside ``path``;
    :class:`CheckpointError` naming what is wrong otherwise."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise CheckpointError(f"{path} has no {MANIFEST}: the checkpoint is incomplete")
    manifest = read_json_file(manifest_path, error=CheckpointError)
    if not all(isinstance(v, str) for v in manifest.values()):
        raise CheckpointError(f"{manifest_path} is corrupt: not an object of file -> SHA-256")
    for name in manifest:
        if not _plain_name(name) or not _inside(path / name, path):
            raise CheckpointError(
                f"{manifest_path} names {name[:200]!r}, a file outside {path}; a checkpoint "
                "reads only its own files (this one was altered)"
            )
    for needed in (TRAINER_FILE, ".metadata"):
        if needed not in manifest:
            raise CheckpointError(
                f"{manifest_path} lists no {needed}: the checkpoint is incomplete"
            )
    return manifest


def _check_shard_paths(path: Path, manifest: dict[str, str]) -> None:
    """Every shard file ``.metadata`` names is a file of the manifest (checked, inside)."""
    # torch's reader: imported here, so that finding a checkpoint loads no torch
    from datacentric.train.checkpoints.safe_load import read_metadata_file

    metadata = read_metadata_file(path / ".metadata")
    for info in (metadata.storage_data or {}).values():
        shard = str(getattr(info, "relative_path", ""))
        if shard not in manifest:
            raise CheckpointError(
                f"{path / '.metadata'} reads tensors from {shard[:200]!r}, which is not a file "
                f"of the checkpoint's {MANIFEST}; a checkpoint reads only its own, checksummed "
                "files (this one was altered)"
            )
