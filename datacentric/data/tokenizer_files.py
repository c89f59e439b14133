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

The tokenizer a text dataset is read with is made here too (:class:`TextCodec`, from
``--tokenizer``: UTF-8 bytes, a ``tokenizer.json``, or such a folder), after the
digest of its files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.chat import load_tokenizer
from datacentric.data.documents import require
from datacentric.regular_files import NotRegularFileError, read_regular_bytes

#: Subfolders of a tokenizer folder that transformers reads templates from.
TEMPLATE_FOLDERS = ("additional_chat_templates",)
#: File endings of model weights and training state: they decide no token, and are large.
WEIGHT_ENDINGS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
WEIGHT_ENDINGS += (".onnx", ".npy", ".npz", ".distcp")
#: ``--tokenizer bytes``: UTF-8 bytes, vocabulary 256 (the default of our own models only).
BYTES = "bytes"


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
            content = read_regular_bytes(path)
        except NotRegularFileError as err:
            raise DataError(f"--tokenizer {folder}: {err}") from None
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(len(content).to_bytes(8, "little") + content)
    return digest.hexdigest()


class TextCodec:
    """UTF-8 bytes, a ``tokenizer.json`` through the ``tokenizers`` library, or a
    tokenizer folder through transformers (:func:`~datacentric.data.chat.load_tokenizer`)."""

    def __init__(self, path: str | None) -> None:
        self.path, self.hf = path, None
        if path is None or path == BYTES:
            self.vocab_size, self.digest, self._tok = 256, "bytes", None
            return
        if Path(path).is_dir():
            self.digest = tokenizer_digest(path)  # first: it refuses a FIFO before a read
            self.hf, self._tok = load_tokenizer(path), None
            self.vocab_size = len(self.hf)
            return
        if not Path(path).is_file():
            raise DataError(
                f"--tokenizer {path}: no such file or folder (give a local tokenizer.json or "
                "a folder saved with save_pretrained)"
            )
        tokenizers = require("tokenizers")
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as err:  # the library raises its own exception type
            raise DataError(f"--tokenizer {path}: not a tokenizer.json ({err})") from None
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()

    @property
    def is_bytes(self) -> bool:
        """UTF-8 bytes (vocabulary 256): a text's ids are its UTF-8 bytes."""
        return self.hf is None and self._tok is None

    @property
    def dtype(self) -> np.dtype:
        if self.vocab_size <= 256:
            return np.dtype(np.uint8)
        return np.dtype(np.uint16 if self.vocab_size <= 2**16 else np.uint32)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text, whatever its length (``verbose=False``: transformers'
        warning of a text longer than the model's length is no concern of documents that
        ``--max-tokens`` chunks)."""
        if self.hf is not None:
            encoded = self.hf(texts, verbose=False)["input_ids"]
            return [np.asarray(ids, dtype=self.dtype) for ids in encoded]
        if self.is_bytes:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        return [np.asarray(e.ids, dtype=self.dtype) for e in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text (the inverse of :meth:`encode`; bytes that are no UTF-8
        are replaced)."""
        if self.hf is not None:
            return str(self.hf.decode(ids))
        if self._tok is None:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return str(self._tok.decode(ids))


def text_codec(tokenizer: str | None) -> TextCodec:
    """The ``[data] tokenizer``'s encoder and decoder (``encode(texts)``, ``decode(ids)``;
    ``None``: UTF-8 bytes), as the text datasets tokenize."""
    return TextCodec(tokenizer)
