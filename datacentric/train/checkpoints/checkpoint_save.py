"""Writing a checkpoint (collective): model and optimizer through
``torch.distributed.checkpoint`` (in the background with ``async_save``), each rank's RNG
states, then ``trainer.json`` and the manifest; the folder renamed from ``step-N.tmp``
when complete, ``latest`` switched, and only then older copies and checkpoints beyond
``keep_last`` deleted (:func:`start_checkpoint`, :class:`PendingSave`). A full disk, a
quota or a file-size limit is a :class:`CheckpointError` saying so.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from datacentric.train.checkpoints.checkpoint_folders import (
    MANIFEST,
    TRAINER_FILE,
    CheckpointError,
    checkpoint_dir,
    checkpoint_step,
    list_checkpoints,
)
from datacentric.train.checkpoints.checkpoint_verify import _sha256
from datacentric.train.checkpoints.state_names import without_aliases


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


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


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
