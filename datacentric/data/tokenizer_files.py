"""What a tokenizer folder's tokens depend on: the digest in the token cache's key.

transformers reads a tokenizer saved with ``save_pretrained`` from the folder's own
files (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
``added_tokens.json``, ``chat_template.jinja`` / ``.json``, vocabularies, merges,
``config.json`` for the tokenizer's class) and renders conversations with
``additional_chat_templates/*.jinja`` when the folder has them. The digest covers every
file of the folder and of ``additional_chat_templates/``, by name and content, except
model weights (which decide no token): any file transformers reads now or a later
version starts to read changes the key, so an edited folder never reuses a cache built
from the old one. Every entry must be a regular file (a FIFO would block the read).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from datacentric.data.base import DataError
from datacentric.regular_files import NotRegularFileError, open_regular

#: Subfolders of a tokenizer folder that transformers reads templates from.
TEMPLATE_FOLDERS = ("additional_chat_templates",)
#: File endings of model weights and training state: they decide no token, and are large.
WEIGHT_ENDINGS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
WEIGHT_ENDINGS += (".onnx", ".npy", ".npz", ".distcp")


def tokenizer_files(folder: str | Path) -> list[Path]:
    """The files of a tokenizer folder that the digest covers, in a fixed order."""
    root = Path(folder)
    found = [p for p in root.iterdir() if p.name not in TEMPLATE_FOLDERS]
    for sub in TEMPLATE_FOLDERS:
        if (root / sub).is_dir():
            found += list((root / sub).iterdir())
        elif (root / sub).exists():
            found.append(root / sub)
    # subfolders other than the template folders hold no tokenizer file
    kept = [p for p in found if not p.name.endswith(WEIGHT_ENDINGS) and not p.is_dir()]
    return sorted(kept, key=lambda p: p.relative_to(root).as_posix())


def tokenizer_digest(folder: str | Path) -> str:
    """SHA-256 over the name and bytes of every :func:`tokenizer_files` entry;
    :class:`DataError` naming an entry that is not a regular file."""
    root = Path(folder)
    digest = hashlib.sha256()
    for path in tokenizer_files(root):
        try:
            with open_regular(path, "rb") as handle:
                content = handle.read()
        except NotRegularFileError as err:
            raise DataError(f"--tokenizer {folder}: {err}") from None
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(len(content).to_bytes(8, "little") + content)
    return digest.hexdigest()
