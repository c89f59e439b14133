"""Reading a checkpoint without running code from it (docs/reliability.md, "Trust").

Python's unpickler calls whatever a file names; a checkpoint copied from another
machine must not get to do that. Every pickle a checkpoint holds is therefore read
with an allow-list:

- ``rng-rankR.pt`` (a dict of byte tensors) with ``torch.load(weights_only=True)``;
- the non-tensor entries of ``torch.distributed.checkpoint``'s shards (optimizer
  hyper-parameters) with ``weights_only=True`` too (:class:`SafeLoadPlanner`; torch's
  default planner unpickles them unrestricted);
- DCP's ``.metadata`` with :class:`MetadataUnpickler`, which builds only DCP's own
  metadata records, ``torch.Size`` and dtypes (:class:`SafeFileSystemReader`; torch's
  reader uses a plain ``pickle.load``).

A file that names anything else is an :class:`UnsafeFileError` naming the file, raised
before the object it describes is built, so nothing in it runs.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from datacentric.regular_files import open_regular

#: (module, name) pairs DCP's ``.metadata`` pickle may name: its record types.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "LoadItemType"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name, as weights_only allows
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),  # the checkpoint id DCP records (a path built from a string)
    ("pathlib", "WindowsPath"),
}


class UnsafeFileError(RuntimeError):
    """A file of a checkpoint holds something other than data (a pickle that names code)."""

    def __init__(self, path: str | Path, detail: str) -> None:
        super().__init__(
            f"{path}: refused to load: {detail}; a checkpoint's files hold only tensors and "
            "plain values, so this one was altered or is not a checkpoint of datacentric "
            "(nothing in it was run)"
        )
        self.path = str(path)


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``: only its own record types, ``torch.Size``,
    dtypes, layouts and memory formats may be named (Python's "restricting globals")."""

    def __init__(self, file: Any, path: str | Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.layout | torch.memory_format
        ):
            return getattr(torch, name)
        raise UnsafeFileError(self.path, f"it names {module}.{name}, which is not checkpoint data")


def read_metadata_file(path: str | Path) -> Metadata:
    """DCP's ``.metadata`` at ``path``, read with :class:`MetadataUnpickler`."""
    with open_regular(path, "rb") as handle:
        try:
            metadata = MetadataUnpickler(handle, path).load()
        except UnsafeFileError:
            raise
        except Exception as err:  # noqa: BLE001 - any malformed pickle is a bad file
            raise UnsafeFileError(path, f"it is not a DCP metadata record ({err})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeFileError(path, f"it holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by :func:`read_metadata_file`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        metadata = read_metadata_file(Path(self.path) / name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor entries load with ``weights_only=True``."""

    def __init__(self, checkpoint: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint = Path(checkpoint)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            info = (self.metadata.storage_data or {}).get(read_item.storage_index)
            file = self.checkpoint / (info.relative_path if info else "?")
            first = str(err).strip().splitlines()
            raise UnsafeFileError(
                file,
                f"entry {read_item.dest_index.fqn} is not plain data"
                + (f" ({first[-1][:160]})" if first else ""),
            ) from None
        super().load_bytes(read_item, _as_stream(loaded))


def _as_stream(value: Any) -> io.BytesIO:
    """``value`` re-serialised, for the parent's ``load_bytes`` (which unpickles it)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def load_tensor_file(path: str | Path) -> Any:
    """A ``torch.save`` file of tensors and plain values (``weights_only=True``)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        lines = str(err).strip().splitlines()
        why = next((ln.strip() for ln in lines if "GLOBAL" in ln or "Unsupported" in ln), "")
        raise UnsafeFileError(
            path, "it holds objects other than tensors" + (f" ({why[:160]})" if why else "")
        ) from None
