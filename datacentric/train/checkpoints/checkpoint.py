"""Atomic, checksummed checkpoints built on ``torch.distributed.checkpoint``.

Layout of a run folder::

    checkpoints/step-00000006/     one checkpoint (DCP shards + our files)
        .metadata, __0_0.distcp    model and optimizer state (torch.distributed.checkpoint)
        rng-rank0.pt ...           each rank's RNG states (tensors only)
        trainer.json               position (epoch, iteration, samples seen, consumed ids),
                                   learning-rate schedule, profile fingerprint, world size
        manifest.json              SHA-256 of every file above (written last)
    checkpoints/latest             name of the newest complete checkpoint

A checkpoint is written into ``step-N.tmp`` and renamed only when complete (to
``step-N``, or ``step-N-rK`` when step N was saved before: a final save after a
periodic one), then ``latest`` is switched atomically, and only then are older
copies and checkpoints beyond ``keep_last`` deleted: a kill at any moment leaves
``latest`` naming a complete checkpoint. Loading verifies every checksum first;
:func:`find_checkpoint` falls back to the newest valid checkpoint, with a notice,
when ``latest`` is missing, dangling or corrupt. A full disk is a
:class:`CheckpointError` saying so. Model and optimizer go
through ``torch.distributed.checkpoint`` so that a run can resume on a different
number of ranks (replicated parameters are resharded by DCP's planner).

Nothing in a checkpoint runs code when it is read (:mod:`datacentric.train.checkpoints.safe_load`):
every pickle in it goes through an allow-list, and ``expect_sha256`` (the SHA-256 of
``manifest.json``, printed at save time and by ``inspect``) pins every file of a
checkpoint before any of them is read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from datacentric.log import get_logger
from datacentric.regular_files import file_sha256, read_json_file, read_regular_text
from datacentric.settings.run_settings import record_sections
from datacentric.settings.schema import ConfigError
from datacentric.train.checkpoints.safe_load import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeFileError,
    load_tensor_file,
    read_metadata_file,
)
from datacentric.train.checkpoints.state_names import with_aliases, without_aliases

MANIFEST = "manifest.json"
TRAINER_FILE = "trainer.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, of another model, or cannot be written."""


_STEP_DIR = re.compile(r"^step-(\d+)(?:-r(\d+))?$")


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint folder name (``step-N`` or ``step-N-rK``), else None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


_UNFINISHED_DIR = re.compile(r"^step-(\d+)\.tmp$")


def unfinished_saves(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the run's ``step-N.tmp`` folders, oldest first: saves that
    were cut short (killed, or stopped by a full disk) or are still being written."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(_UNFINISHED_DIR.match(p.name), p) for p in root.iterdir() if _is_own_dir(p)]
    return sorted((int(m.group(1)), p) for m, p in found if m)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders (complete or not, no ``.tmp``), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    # a linked folder is not one of ours: its files lie outside the run
    found = [(_STEP_DIR.match(p.name), p) for p in root.iterdir() if _is_own_dir(p)]
    ordered = sorted((int(m.group(1)), int(m.group(2) or 0), p) for m, p in found if m)
    return [p for _, _, p in ordered]


def _rank_failures(err: BaseException) -> list[tuple[int | None, BaseException]]:
    """``(rank, exception)`` of each rank a DCP ``CheckpointException`` collected, else
    ``[(None, err)]``."""
    failures = getattr(err, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return [(None, err)]
    found = []
    for rank, failure in sorted(failures.items()):
        exc = failure[0] if isinstance(failure, tuple) else failure
        found.append((rank, exc if isinstance(exc, BaseException) else err))
    return found


#: What a write cut short by a full disk, a quota or a file-size limit (``ulimit -f``)
#: says: the errno of an ``OSError``, or the text of torch's writer, which reports a short
#: write as ``[enforce fail at inline_container.cc:...] . unexpected pos N vs M``.
WRITE_LIMIT_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
WRITE_LIMIT_TEXTS = (
    "No space left on device",
    "File too large",
    "Disk quota exceeded",
    "file write failed",
    "unexpected pos",
    "[Errno 28]",
    "[Errno 27]",
)


def _is_disk_full(err: BaseException) -> bool:
    """A save that failed because the disk, a quota or a file-size limit stopped a write
    (on any rank, or anywhere in the chain of causes)."""
    seen: list[BaseException] = [exc for _, exc in _rank_failures(err)]
    while seen:
        exc = seen.pop()
        if getattr(exc, "errno", None) in WRITE_LIMIT_ERRNOS or any(
            text in str(exc) for text in WRITE_LIMIT_TEXTS
        ):
            return True
        seen += [e for e in (exc.__cause__, exc.__context__) if isinstance(e, BaseException)]
    return False


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _is_own_dir(path: Path) -> bool:
    """A real folder (not a symbolic link to one)."""
    return path.is_dir() and not path.is_symlink()


def _inside(path: Path, folder: Path) -> bool:
    """``path``, its links followed, lies inside ``folder`` (also followed)."""
    return path.resolve().is_relative_to(folder.resolve())


def _plain_name(name: Any) -> bool:
    """A file name of its folder: no separator, not ``.`` or ``..``, not absolute."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    return file_sha256(path)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a link left there is removed, never written through
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_checkpoint(*args: Any, **kwargs: Any) -> Path:
    """Save on every rank (collective) and wait for it: :func:`start_checkpoint`'s
    arguments; returns the final checkpoint folder."""
    return start_checkpoint(*args, **kwargs).wait()


class PendingSave:
    """A checkpoint whose shards are being written (``async_save``): :meth:`wait` (on
    every rank: collective) waits for them, then writes ``trainer.json`` and the
    manifest, renames the folder and switches ``latest``; until then no reader sees it."""

    def __init__(
        self,
        run_dir: Path,
        step: int,
        tmp: Path,
        trainer_state: dict[str, Any],
        keep_last: int | None,
        before_commit: Callable[[], None] | None,
        written: Any,
        keep_steps: tuple[int, ...] = (),
    ) -> None:
        self.run_dir, self.step, self.tmp = run_dir, step, tmp
        self.trainer_state = trainer_state
        self.keep_last, self.before_commit = keep_last, before_commit
        self.written = written
        """DCP's future of the shards (``None``: written already)."""
        self.keep_steps = keep_steps
        """Steps whose checkpoints ``keep_last`` does not prune (the best validation's)."""

    def wait(self) -> Path:
        """Finish the save; returns the final checkpoint folder."""
        root = checkpoint_dir(self.run_dir)
        try:
            if self.written is not None:
                self.written.result()  # re-raises a rank's CheckpointException
                self.written = None
            if self.before_commit is not None:
                self.before_commit()
            _barrier()
            final = _final_name(root, self.step)
            if _rank() == 0:
                tmp = self.tmp
                (tmp / TRAINER_FILE).write_text(json.dumps(self.trainer_state), encoding="utf-8")
                files = sorted(p for p in tmp.iterdir() if p.is_file())
                manifest = {p.name: _sha256(p) for p in files}
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
                os.replace(tmp, final)
                _write_atomic(root / "latest", final.name)
                _prune(self.run_dir, final, self.keep_last, self.keep_steps)
        except (Exception, CheckpointException) as err:  # DCP's is a BaseException
            _raise_save_error(err, self.step, root, self.tmp)
        _barrier()
        return final


_ASYNC_GROUP: list[Any] = []
"""The gloo group of background saves (made once, on every rank at the first one), so
their collectives never interleave with the training's on the default group."""


def _async_group() -> Any:
    if not dist.is_initialized():
        return None
    if not _ASYNC_GROUP:
        _ASYNC_GROUP.append(dist.new_group(backend="gloo"))
    return _ASYNC_GROUP[0]


def start_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    keep_last: int | None = None,
    before_commit: Callable[[], None] | None = None,
    *,
    async_save: bool = False,
    keep_steps: tuple[int, ...] = (),
) -> PendingSave:
    """Start a save on every rank (collective): the state is taken now (``async_save``:
    staged to CPU memory, then written by ``torch.distributed.checkpoint.async_save`` in a
    background thread while training goes on); :meth:`PendingSave.wait` completes it.

    ``trainer_state`` must be JSON-able (position, lr schedule state, fingerprint).
    ``keep_last``: delete all but the newest N checkpoints after the save, and those of
    ``keep_steps``.
    ``before_commit``: called on every rank once its files are written (fault injection).
    """
    run_dir = Path(run_dir)
    root = checkpoint_dir(run_dir)
    tmp = root / f"step-{step:08d}.tmp"
    try:
        if _rank() == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        _barrier()
        state = {
            "model": without_aliases(model, get_model_state_dict(model)),
            "optimizer": get_optimizer_state_dict(model, optimizer),
        }
        written = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process.*")
            if async_save:
                written = dcp.async_save(
                    state,
                    checkpoint_id=str(tmp),
                    process_group=_async_group(),
                    no_dist=not dist.is_initialized(),
                )
                written = getattr(written, "upload_completion", written)
            else:
                dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
        torch.save(rng_state(), tmp / f"rng-rank{_rank()}.pt")
    except (Exception, CheckpointException) as err:  # DCP's is a BaseException
        _raise_save_error(err, step, root, tmp)
    return PendingSave(
        run_dir, step, tmp, trainer_state, keep_last, before_commit, written, keep_steps
    )


def _raise_save_error(err: BaseException, step: int, root: Path, tmp: Path) -> NoReturn:
    """Remove the unfinished folder and raise what a failed save says (a full disk, or
    each rank's failure)."""
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    if _is_disk_full(err):
        raise CheckpointError(
            f"no space left on device while saving checkpoint step {step} to {root} (or a "
            "quota or file-size limit stopped the write); free space (or pass --keep-last N, "
            "or raise `ulimit -f`) and resume with --resume; the previous checkpoint is kept"
        ) from err
    failed = "; ".join(  # each rank and what failed there
        (f"rank {rank}: " if rank is not None else "") + f"{type(exc).__name__}: {_first_line(exc)}"
        for rank, exc in _rank_failures(err)
    )
    raise CheckpointError(f"saving checkpoint step {step} to {root} failed: {failed}") from err


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


def _final_name(root: Path, step: int) -> Path:
    """``step-N``, or ``step-N-rK`` (next free K) when step N was saved before."""
    final = root / f"step-{step:08d}"
    revision = 0
    while final.exists():
        revision += 1
        final = root / f"step-{step:08d}-r{revision}"
    return final


def _prune(
    run_dir: str | Path, current: Path, keep_last: int | None, keep_steps: tuple[int, ...] = ()
) -> None:
    """After ``latest`` names ``current``: delete older copies of its step and all
    but the newest ``keep_last`` checkpoints and those of ``keep_steps``."""
    step = checkpoint_step(current)
    others = [p for p in list_checkpoints(run_dir) if p != current]
    stale = [p for p in others if checkpoint_step(p) == step]
    if keep_last is not None:
        kept = [p for p in others if p not in stale][-(keep_last - 1) :] if keep_last > 1 else []
        kept += [p for p in others if checkpoint_step(p) in keep_steps]
        stale += [p for p in others if p not in stale and p not in kept]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


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
            verify(named, expect_sha256)
            return named, None
        except CheckpointError as err:
            problem = str(err)
    else:
        problem = f"{pointer} is missing"
    for path in reversed(candidates):
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


def resolve_resume_from(run_dir: str | Path, spec: str) -> Path:
    """The checkpoint ``--resume-from`` names: a folder, or a step number of ``run_dir``."""
    if spec.isdigit():
        matches = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) == int(spec)]
        if not matches:
            steps = sorted({checkpoint_step(p) for p in list_checkpoints(run_dir)})
            raise CheckpointError(
                f"--resume-from {spec}: {checkpoint_dir(run_dir)} has no checkpoint of step "
                f"{spec} (it has steps {steps or 'none'})"
            )
        return matches[-1]
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"--resume-from {spec}: no such checkpoint folder")
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
    metadata = read_metadata_file(path / ".metadata")
    for info in (metadata.storage_data or {}).values():
        shard = str(getattr(info, "relative_path", ""))
        if shard not in manifest:
            raise CheckpointError(
                f"{path / '.metadata'} reads tensors from {shard[:200]!r}, which is not a file "
                f"of the checkpoint's {MANIFEST}; a checkpoint reads only its own, checksummed "
                "files (this one was altered)"
            )


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    expect_model: str | None = None,
    expect_sha256: str | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Load model, optimizer and this rank's RNG (collective); return the trainer state.

    On a different world size, ranks without a saved RNG state keep their own. A
    checkpoint of another model (``expect_model``: this run's model setting, checked
    against the saved config; or tensors of other shapes) is a :class:`CheckpointError`;
    so is a manifest whose SHA-256 is not ``expect_sha256`` (checked first), and a file
    that holds anything but data (:class:`~datacentric.train.checkpoints.safe_load.UnsafeFileError`,
    raised before it is built). ``check(trainer_state)``: called once the checkpoint
    verifies and before any tensor is read (a resume refuses changed settings there).
    """
    path = Path(path)
    trainer_state = verify_checkpoint(path, expect_sha256)
    state = {
        "model": without_aliases(model, get_model_state_dict(model)),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }
    saved_model = _saved_model(trainer_state.get("config") or {}, path)
    if expect_model is not None and saved_model is not None and saved_model != expect_model:
        raise CheckpointError(
            f"{path} holds a {saved_model!r} model, this run builds {expect_model!r}; "
            "resume with the same model or choose another --out"
        )
    if check is not None:
        check(trainer_state)
    _check_model_tensors(state["model"], path)
    try:
        _load_dcp(state, path)
    except (Exception, CheckpointException) as err:
        unsafe = _unsafe_cause(err)
        if unsafe is not None:
            raise unsafe from None
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith(("raise ", "File ", "^"))]  # source
        detail = next((ln for ln in lines if "size" in ln or "Missing key" in ln), None)
        detail = detail or (lines[-1] if lines else type(err).__name__)
        raise CheckpointError(
            f"{path} does not fit this model (a checkpoint of another model or size?): "
            f"{detail[:200]}"
        ) from err
    set_model_state_dict(model, with_aliases(model, state["model"]))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    rng_file = path / f"rng-rank{_rank()}.pt"
    if rng_file.name in read_manifest(path):  # a file the manifest lacks is not read
        set_rng_state(load_tensor_file(rng_file))
    return trainer_state


def _check_model_tensors(model_state: dict[str, Any], path: Path) -> None:
    """Every tensor of the model is in the checkpoint (its ``.metadata``), else one line
    naming the first missing and what they are (LoRA adapters the checkpoint lacks)."""
    saved = read_metadata_file(path / ".metadata").state_dict_metadata
    missing = [name for name in model_state if f"model.{name}" not in saved]
    if not missing:
        return
    first = next((name for name in missing if ".lora_" in name), missing[0])
    why = ", LoRA adapters among them: it was saved without adapters" if ".lora_" in first else ""
    raise CheckpointError(
        f"{path / '.metadata'}: the checkpoint holds no tensor {first!r} of this model "
        f"({len(missing)} missing{why}); resume with the model and --lora settings it was "
        "saved with"
    )


def _saved_model(record: dict[str, Any], path: Path) -> str | None:
    """The model a checkpoint's settings record names (sectioned, or an earlier
    release's flat keys); ``None`` when it names none."""
    try:
        return record_sections(record, str(path / TRAINER_FILE))["model"].get("model")
    except ConfigError as err:
        raise CheckpointError(str(err)) from None


def _load_dcp(state: dict[str, Any], path: Path, single: bool = False) -> None:
    """``dcp.load`` into ``state`` with the allow-listing reader and planner."""
    # Read here first: DCP would turn the refusal into a message inside its own error.
    read_metadata_file(path / ".metadata")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(
            state,
            storage_reader=SafeFileSystemReader(str(path)),
            planner=SafeLoadPlanner(path),
            no_dist=single or not dist.is_initialized(),
        )


def _unsafe_cause(err: BaseException) -> UnsafeFileError | None:
    """The :class:`UnsafeFileError` behind a DCP failure (raised as is on one process,
    collected per rank in a ``CheckpointException`` otherwise), if any."""
    seen: list[Any] = [err]
    while seen:
        current = seen.pop()
        if isinstance(current, UnsafeFileError):
            return current
        if not isinstance(current, BaseException):
            continue
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            for failure in failures.values():  # (exception, stack) per rank
                seen.extend(f for f in (failure if isinstance(failure, tuple) else (failure,)))
        for linked in (current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                seen.append(linked)
    return None


def weights_sha256(model_state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the state dict's tensors in name order (bytes of each tensor)."""
    digest = hashlib.sha256()
    for name in sorted(model_state):
        tensor = model_state[name]
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Read the model tensors of a checkpoint in one process (for ``inspect``);
    call :func:`verify_checkpoint` first. Reads only tensors (no pickle runs)."""
    path = Path(path)
    metadata = read_metadata_file(path / ".metadata")
    model = {
        key.removeprefix("model."): torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }
    state = {"model": model}
    try:
        _load_dcp(state, path, single=True)
    except (Exception, CheckpointException) as err:
        unsafe = _unsafe_cause(err)
        if unsafe is not None:
            raise unsafe from None
        raise
    return state["model"]
