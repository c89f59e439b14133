"""The files of a latent folder: its listing, and latent tensors in ``.npy``,
``.safetensors`` or ``.pt`` files (shape and dtype from the header alone, data through a
memory map).

Listing (:func:`read_latent_listing`): ``DIR/manifest.jsonl`` if present (one JSON
object per line, ``{"latent": PATH, "text": PATH}`` and what ``prepare`` records:
``frames``, ``bucket``, ``source``, ``logvar``; paths relative to the manifest), else
every latent file below ``DIR`` (sorted; symlinked folders entered); a manifest file
may be given itself. A latent ``NAME.EXT`` may have a text embedding ``NAME.text.EXT``
beside it (such files, and ``NAME.logvar.EXT``, are never latents themselves).

``.npy``: the array header. ``.safetensors``: the JSON header (the file's only tensor,
or the one named ``latent``, ``latents`` or ``x``). ``.pt``: ``torch.load`` with
``mmap=True`` (a tensor, or a dict holding one as above), which maps the storage
without reading it. A file whose header is unreadable or whose data is shorter than
its header says is a :class:`~datacentric.data.base.DataError` naming the file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from datacentric.data.base import DataError
from datacentric.data.documents import paths_below
from datacentric.data.text_file import numbered_lines, parse_json_line, read_text_file
from datacentric.regular_files import check_regular, open_regular

LATENT_SUFFIXES = (".npy", ".safetensors", ".pt")
#: The listing of a latent folder (``prepare`` writes it).
MANIFEST = "manifest.jsonl"
TENSOR_KEYS = ("latent", "latents", "x")
_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # read as raw 16-bit words, reinterpreted by torch
}


def _pick(names: list[str], path: Path) -> str:
    if len(names) == 1:
        return names[0]
    for key in TENSOR_KEYS:
        if key in names:
            return key
    raise DataError(
        f"{path}: {len(names)} tensors ({', '.join(names[:5])}); name the latent one of "
        f"{', '.join(TENSOR_KEYS)}"
    )


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    with open_regular(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
            version, np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(handle)
        return tuple(shape), dtype, handle.tell()


def _safetensors_header(path: Path) -> tuple[tuple[int, ...], str, int]:
    with open_regular(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        if size > path.stat().st_size:
            raise ValueError(f"header length {size} exceeds the file")
        header = json.loads(handle.read(size))
    names = [k for k in header if k != "__metadata__"]
    entry = header[_pick(names, path)]
    begin, end = entry["data_offsets"]
    if entry["dtype"] not in _SAFETENSORS_DTYPES:
        raise ValueError(f"dtype {entry['dtype']} (use F32, F16, BF16 or F64)")
    return tuple(entry["shape"]), entry["dtype"], 8 + size + begin


def _pt_tensor(path: Path) -> torch.Tensor:
    value = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    if isinstance(value, dict):
        names = [k for k, v in value.items() if isinstance(v, torch.Tensor)]
        value = value[_pick(names, path)]
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"holds a {type(value).__name__}, not a tensor")
    return value.detach()  # data: a saved tensor may carry requires_grad


def read_shape(path: str | Path) -> tuple[int, ...]:
    """Shape of the latent tensor in ``path`` (reads the header only)."""
    path = Path(path)
    try:
        if path.suffix == ".npy":
            shape, dtype, offset = _npy_header(path)
            needed = offset + int(np.prod(shape)) * dtype.itemsize
        elif path.suffix == ".safetensors":
            shape, dtype_name, offset = _safetensors_header(path)
            itemsize = np.dtype(_SAFETENSORS_DTYPES[dtype_name]).itemsize
            needed = offset + int(np.prod(shape)) * itemsize
        elif path.suffix == ".pt":
            check_regular(path)  # torch.load would block on a FIFO
            return tuple(_pt_tensor(path).shape)
        else:
            raise ValueError(f"unknown suffix (use {', '.join(LATENT_SUFFIXES)})")
    except DataError:
        raise
    except Exception as err:  # every reader's own failure is a corrupt file to the user
        raise DataError(f"{path}: corrupt or unreadable latent file ({err})") from None
    if path.stat().st_size < needed:
        raise DataError(
            f"{path}: corrupt latent file (truncated: {path.stat().st_size} bytes, the "
            f"header needs {needed})"
        )
    return shape


def open_latent(path: str | Path) -> np.ndarray | torch.Tensor:
    """The latent tensor of ``path``, memory-mapped (read lazily when sliced): a numpy
    memmap for ``.npy`` and ``.safetensors``, a tensor for ``.pt`` and bfloat16 data."""
    path = Path(path)
    try:
        check_regular(path)  # np.load, np.memmap and torch.load would block on a FIFO
        if path.suffix == ".npy":
            return np.load(path, mmap_mode="r")
        if path.suffix == ".safetensors":
            shape, dtype_name, offset = _safetensors_header(path)
            data = np.memmap(path, np.dtype(_SAFETENSORS_DTYPES[dtype_name]), "r", offset, shape)
            if dtype_name == "BF16":
                return torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16)
            return data
        return _pt_tensor(path)
    except Exception as err:
        raise DataError(f"{path}: corrupt or unreadable latent file ({err})") from None


def as_float_tensor(data: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A (sliced) latent as a contiguous float32 tensor that owns its memory."""
    if isinstance(data, np.ndarray):
        return torch.from_numpy(np.array(data, dtype=np.float32))
    return data.to(torch.float32).contiguous().clone()


def _text_beside(latent: Path) -> Path | None:
    stem = latent.name[: -len(latent.suffix)]
    for suffix in LATENT_SUFFIXES:
        candidate = latent.with_name(f"{stem}.text{suffix}")
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class LatentEntry:
    """One latent of a listing and what its manifest line says of it."""

    latent: Path
    text: Path | None
    where: str
    """The manifest line (``FILE:LINE``) or the file, for messages."""
    frames: int | None = None
    """Pixel frames it was encoded from (``prepare``'s manifests), else None."""
    bucket: str | None = None
    """The bucket ``prepare`` chose for it, else None."""
    source: str | None = None
    """The media file it was encoded from, as the manifest's ``source`` says, else None."""
    logvar: Path | None = None
    """The VAE's log-variance beside the latent (its mean; ``prepare --latent-dist
    sample``), else None: the latent is trained as it is."""


def read_latent_listing(source: str) -> list[LatentEntry]:
    """The :class:`LatentEntry` of every latent of a folder or manifest, in order."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / MANIFEST).is_file():
        path = path / MANIFEST
    if path.is_file():
        found = []
        listing = read_text_file(path, f"latents:{source}", "a manifest.jsonl of JSON lines")
        for number, line in numbered_lines(listing):
            if not line.strip():
                continue
            entry = parse_json_line(line, f"{path}:{number}")
            name = entry.get("latent", entry.get("path")) if isinstance(entry, dict) else None
            if not isinstance(name, str):
                raise DataError(
                    f'{path}:{number}: want a JSON object {{"latent": PATH, "text": PATH}}'
                )
            latent = path.parent / name
            try:
                found_file = latent.is_file()
            except (OSError, ValueError) as err:  # a name too long, a NUL byte
                raise DataError(f"{path}:{number}: latent {name[:200]!r}: {err}") from None
            if not found_file:
                raise DataError(f"{path}:{number}: latent file {latent} not found")
            text = entry.get("text")
            frames, bucket, source = entry.get("frames"), entry.get("bucket"), entry.get("source")
            logvar = entry.get("logvar")
            for key, value in (("text", text), ("logvar", logvar)):
                if value is not None and not isinstance(value, str):
                    raise DataError(f"{path}:{number}: {key} {value!r:.80}; want a file path")
            if logvar is not None and not (path.parent / str(logvar)).is_file():
                raise DataError(f"{path}:{number}: logvar file {path.parent / logvar} not found")
            if frames is not None and (not isinstance(frames, int) or frames < 1):
                raise DataError(f"{path}:{number}: frames {frames!r}; want a positive integer")
            found.append(
                LatentEntry(
                    latent,
                    path.parent / text if text else _text_beside(latent),
                    f"{path}:{number}",
                    frames,
                    bucket if isinstance(bucket, str) else None,
                    source if isinstance(source, str) else None,
                    path.parent / logvar if logvar is not None else None,
                )
            )
        if not found:
            raise DataError(f"latents:{source}: {path} lists no latent")
        return found
    if not path.is_dir():
        raise DataError(f"latents:{source}: no such folder or manifest")
    files = [  # symlinked folders entered (a shard of latents linked in)
        p
        for p in paths_below(path)
        if p.is_file() and p.suffix in LATENT_SUFFIXES and not p.stem.endswith((".text", ".logvar"))
    ]
    if not files:
        raise DataError(f"latents:{source}: folder has no {'/'.join(LATENT_SUFFIXES)} latent")
    return [LatentEntry(p, _text_beside(p), str(p)) for p in files]
