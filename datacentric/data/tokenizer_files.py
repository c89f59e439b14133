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
#: ``--tokenizer bytes``: UTF-8 bytes, vocabulary 256 (the default of our own models only).
BYTES = "bytes"
#: Files of which a folder a transformers tokenizer loads from holds at least one.
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
TOKENIZER_MARKERS += ("vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


def holds_tokenizer(folder: str | Path) -> bool:
    """``folder`` holds a tokenizer's files (:data:`TOKENIZER_MARKERS`)."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_MARKERS)


def model_tokenizer(model: str, tokenizer: str | None) -> str | None:
    """The tokenizer a run of ``--model model`` reads text with: ``tokenizer`` when given
    (``bytes`` included); unset, the folder of an ``hf:DIR`` model, whose own tokenizer
    it is, and ``None`` (UTF-8 bytes) for every other model. :class:`DataError` for an
    ``hf:DIR`` folder that holds no tokenizer."""
    if tokenizer is not None or not model.startswith("hf:"):
        return tokenizer
    folder = Path(model.removeprefix("hf:")).expanduser()
    if not folder.is_dir():  # a tiny name (hf:qwen2): our own random-weight config
        return None
    if not holds_tokenizer(folder):
        raise DataError(
            f"--model {model}: the model folder holds no tokenizer; pass --tokenizer DIR (a "
            "folder saved with tokenizer.save_pretrained, or its tokenizer.json), or "
            f"--tokenizer {BYTES} for UTF-8 bytes"
        )
    return str(folder)


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
