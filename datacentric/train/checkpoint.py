"""Atomic, checksummed checkpoints built on ``torch.distributed.checkpoint``.

Layout of a run folder::

    checkpoints/step-00000006/     one checkpoint (DCP shards + our files)
        .metadata, __0_0.distcp    model and optimizer state (torch.distributed.checkpoint)
        rng-rank0.pt ...           each rank's RNG states
        trainer.json               position (epoch, iteration, samples seen, consumed ids),
                                   learning-rate schedule, profile fingerprint, world size
        manifest.json              SHA-256 of every file above (written last)
    checkpoints/latest             name of the newest complete checkpoint

A checkpoint is written into ``step-N.tmp`` and renamed only when complete, and
``latest`` is replaced atomically, so a crash mid-save leaves the previous
checkpoint intact. Loading verifies every checksum first. Model and optimizer go
through ``torch.distributed.checkpoint`` so that a run can resume on a different
number of ranks (replicated parameters are resharded by DCP's planner).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

MANIFEST = "manifest.json"
TRAINER_FILE = "trainer.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


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
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
) -> Path:
    """Save on every rank (collective); returns the final checkpoint folder.

    ``trainer_state`` must be JSON-able (position, lr schedule state, fingerprint).
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    state = {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
    torch.save(rng_state(), tmp / f"rng-rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        (tmp / TRAINER_FILE).write_text(json.dumps(trainer_state), encoding="utf-8")
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        manifest = {p.name: _sha256(p) for p in files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_atomic(root / "latest", final.name)
    _barrier()
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None`` if it has none."""
    root = checkpoint_dir(run_dir)
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check every file against the manifest; return the trainer state."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise CheckpointError(f"{path} has no {MANIFEST}: the checkpoint is incomplete")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{manifest_path} is corrupt: {err}") from None
    for name, expected in manifest.items():
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{path}: {name} is missing")
        if _sha256(file) != expected:
            raise CheckpointError(
                f"{path}: checksum mismatch for {name}; the checkpoint is corrupt "
                "(restore it or resume from an earlier one)"
            )
    return json.loads((path / TRAINER_FILE).read_text(encoding="utf-8"))


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Load model, optimizer and this rank's RNG (collective); return the trainer state.

    On a different world size, ranks without a saved RNG state keep their own.
    """
    path = Path(path)
    trainer_state = verify_checkpoint(path)
    state = {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    rng_file = path / f"rng-rank{_rank()}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return trainer_state


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
    call :func:`verify_checkpoint` first."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = Path(path)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "state.pt"
        dcp_to_torch_save(str(path), str(out))
        full = torch.load(out, weights_only=False)
    return full["model"]
