"""Reading a checkpoint: model, optimizer and this rank's RNG into a run
(:func:`load_checkpoint`, collective, after it verifies; a checkpoint of another model is
refused), or the model's tensors alone in one process (:func:`read_model_state`), always
through the allow-listing reader; and the SHA-256 of a model's weights
(:func:`weights_sha256`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

from datacentric.settings.run_settings import record_sections
from datacentric.settings.schema import ConfigError
from datacentric.train.checkpoints.checkpoint_folders import TRAINER_FILE, CheckpointError
from datacentric.train.checkpoints.checkpoint_save import _rank
from datacentric.train.checkpoints.checkpoint_verify import read_manifest, verify_checkpoint
from datacentric.train.checkpoints.safe_load import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeFileError,
    load_tensor_file,
    read_metadata_file,
)
from datacentric.train.checkpoints.state_names import with_aliases, without_aliases


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
