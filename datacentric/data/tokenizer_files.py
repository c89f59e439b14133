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

A long text is encoded in pieces, with the ids of encoding it whole. Encoding one long
string keeps, per token, its offsets, token string, word index and masks, and per byte
the normalizer's alignments: a 20 MB file took about 3.3 GB. :meth:`TextCodec.encode`
cuts a text into pieces of about :data:`PIECE_CHARS` characters where the cut changes
no id (:func:`encode_in_pieces`), and adds the special tokens once, as the whole
encoding does.

Why a cut at ``p`` changes no id (``tokenizers``' ``Tokenizer.encode``): the added
tokens are split out of the text first, then each part is normalized, pre-tokenized
into pieces, each piece tokenized by the model on its own (BPE, WordPiece, Unigram and
WordLevel all see one pre-tokenized piece at a time), and the post-processor wraps the
ids in special tokens. So ``ids(T) == ids(T[:p]) + ids(T[p:])`` (without special
tokens) when

1. normalizing commutes with the cut: ``Lowercase`` maps each character on its own
   (``NormalizedString::lowercase``: ``char::to_lowercase`` per character, no
   final-sigma context), and NFC/NFD/NFKC/NFKD never compose, decompose or reorder
   across a line end, a starter that composes with nothing: every cut is placed right
   after a ``\\n`` (and the window check below compares the normalized halves too);
   any other normalizer (``Replace``, ``Prepend``, ``Precompiled``, ``Strip``,
   ``BertNormalizer``) keeps the text whole;
2. ``p`` is a boundary of the pre-tokenizer's pieces of the whole text: cuts are only
   tried where a line end meets a non-whitespace character, and ``ByteLevel`` (regex on,
   no prefix space), ``Whitespace`` and ``WhitespaceSplit`` have no pattern that joins a
   line end to the non-whitespace character after it (GPT-2's and Llama-3's patterns
   match a line end only with whitespace before it or symbols before it), so every piece
   holding the ``\\n`` ends at ``p`` whatever came before; a ``Split`` counts only with
   Llama 3's or Qwen 2's pattern (:data:`LINE_SPLITS`), isolated: another pattern may
   hold a match that starts before the window and crosses ``p`` (a quoted string over
   lines), or take its matches in a step set at the text's start (``..``), which no
   window shows; ``Metaspace``, ``BertPreTokenizer`` and the rest keep the text whole,
   and so does a tokenizer with no pre-tokenizer (one piece: the model would see the
   whole text);
3. no added token spans ``p`` (or strips the line end before it): checked on the text
   around ``p``; an added token with a line end before its last character keeps the
   text whole (of overlapping matches, as ``\\nx`` and ``x\\n`` in ``\\nx\\nx``, the
   first from the text's start is taken, which no window shows).

The check (:func:`cut_fits`) takes :data:`WINDOW_CHARS` characters each side of ``p``
(at least four times the longest added token, :func:`least_window`: a token touching
the cut lies in it whole). The normalized text after ``p`` must start with no
whitespace (NFKC turns some characters into a space and a mark), the pre-tokenizer's
pieces of the normalized window must have a boundary at ``p``, and the window's ids
must be those of its two halves; a candidate that fails is skipped for the next line
end. For the pre-tokenizers named in 2 the boundary holds whatever precedes the window.
The post-processor (``TemplateProcessing``, ``BertProcessing``,
``RobertaProcessing``, ``ByteLevel``, their ``Sequence``) puts fixed special tokens
before and after a single text's ids: :func:`special_affix` reads them from two probes
and confirms the form, else the text stays whole. Truncation, padding and BPE dropout
also keep it whole (a piece would be cut short, padded, or drawn at random).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


#: Characters of a piece: each is encoded on its own, so memory is that of one piece.
PIECE_CHARS = 1 << 20
#: Characters each side of a cut that :func:`cut_fits` checks.
WINDOW_CHARS = 4096
#: Normalizers that act on each character on its own (condition 1 of the module).
PER_CHARACTER = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
#: Pre-tokenizers whose pieces a model never crosses (condition 2 of the module).
SPLITTING = frozenset({"Split", "Whitespace", "WhitespaceSplit", "ByteLevel"})
#: ``Split`` patterns (Llama 3's, Qwen 2's) of which no match holds a line end and the
#: non-whitespace character after it, whatever text precedes: any other pattern may
#: carry a match across a cut from beyond the checked window (condition 2 of the module).
LINE_SPLITS = frozenset(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits + r"| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    for digits in (r"\p{N}{1,3}", r"\p{N}")
)
#: Texts whose special tokens :func:`special_affix` reads (two lengths, two lines).
PROBES = ("a\nb", "probe one, two\n\nthree 4")
#: A candidate cut: right after a line end, before a non-whitespace character.
_CANDIDATE = re.compile(r"\n(?=\S)")


def _normalizer_fits(config: dict[str, Any] | None) -> bool:
    if config is None:
        return True
    if config.get("type") == "Sequence":
        return all(_normalizer_fits(part) for part in config.get("normalizers", []))
    return config.get("type") in PER_CHARACTER


def _pre_tokenizer_parts(config: dict[str, Any]) -> list[tuple[bool, bool]]:
    """(local, splits) of each pre-tokenizer of ``config`` (a ``Sequence`` flattened):
    local when it acts on each piece on its own, splits when it cuts the text."""
    kind = config.get("type")
    if kind == "Sequence":
        return [p for part in config.get("pretokenizers", []) for p in _pre_tokenizer_parts(part)]
    if kind == "ByteLevel":  # without its regex it only maps bytes (Llama 3 after a Split)
        return [(not config.get("add_prefix_space"), bool(config.get("use_regex", True)))]
    if kind == "Split":
        pattern = (config.get("pattern") or {}).get("Regex")
        fits = config.get("behavior") == "Isolated" and not config.get("invert")
        return [(fits and pattern in LINE_SPLITS, True)]
    return [(kind in SPLITTING, kind in SPLITTING)]


def _pre_tokenizer_fits(config: dict[str, Any] | None) -> bool:
    """Every part local and one that splits (none: the whole text is one piece)."""
    parts = _pre_tokenizer_parts(config) if config is not None else []
    return all(local for local, _ in parts) and any(splits for _, splits in parts)


def splits_cleanly(config: dict[str, Any]) -> bool:
    """Whether a ``tokenizers.Tokenizer`` (``config``: its ``to_str()`` read as JSON)
    encodes a text cut after a line end as the text whole, by its normalizer,
    pre-tokenizer, model, truncation and padding (the module's conditions 1 and 2; the
    rest is checked per cut)."""
    if config.get("truncation") or config.get("padding"):
        return False
    if (config.get("model") or {}).get("dropout"):
        return False
    # a token holding a line end before its last character may match across a cut, and
    # which of its overlapping matches is taken can follow from text before the window
    if any("\n" in t.get("content", "")[:-1] for t in config.get("added_tokens", [])):
        return False
    return _normalizer_fits(config.get("normalizer")) and _pre_tokenizer_fits(
        config.get("pre_tokenizer")
    )


def least_window(config: dict[str, Any], window: int) -> int:
    """``window``, widened so that an added token touching a cut lies within it whole
    (raw characters: a normalized token may come from up to about 3 characters each, as
    a Hangul syllable from its jamo)."""
    longest = max((len(t.get("content", "")) for t in config.get("added_tokens", [])), default=0)
    return max(window, 4 * longest + 16)


def _inner(backend: Any, text: str) -> list[int]:
    return list(backend.encode(text, add_special_tokens=False).ids)


def special_affix(
    backend: Any, whole: Callable[[str], list[int]]
) -> tuple[list[int], list[int]] | None:
    """(ids before, ids after) a text's own ids in ``whole(text)`` (the full encoding, with
    special tokens), the same for both :data:`PROBES`; None when no such pair exists."""
    first, second = (whole(p) for p in PROBES)
    inner_first, inner_second = (_inner(backend, p) for p in PROBES)
    size = len(inner_first)
    for start in range(len(first) - size + 1):
        if first[start : start + size] != inner_first:
            continue
        before, after = first[:start], first[start + size :]
        if second == before + inner_second + after:
            return before, after
    return None


def cut_fits(backend: Any, text: str, cut: int, window: int = WINDOW_CHARS) -> bool:
    """Whether cutting ``text`` at ``cut`` keeps its ids, checked on ``window``
    characters each side: normalized halves that join to the normalized window, a
    pre-tokenizer piece that starts at the cut, and the window's ids equal to those of
    its halves (conditions 1 to 3 of the module)."""
    left, right = text[max(0, cut - window) : cut], text[cut : cut + window]
    joined = left + right
    normalizer, pre_tokenizer = backend.normalizer, backend.pre_tokenizer
    if normalizer is not None:
        left_n, right_n = normalizer.normalize_str(left), normalizer.normalize_str(right)
        if normalizer.normalize_str(joined) != left_n + right_n:
            return False
    else:
        left_n, right_n = left, right
    if not right_n[:1] or right_n[0].isspace():  # NFKC makes a space of some characters
        return False
    if pre_tokenizer is not None:
        starts = {start for _, (start, _) in pre_tokenizer.pre_tokenize_str(left_n + right_n)}
        if len(left_n) not in starts:
            return False
    return _inner(backend, joined) == _inner(backend, left) + _inner(backend, right)


def cuts(
    backend: Any, text: str, piece: int = PIECE_CHARS, window: int = WINDOW_CHARS
) -> Iterator[int]:
    """Positions, at least ``piece`` characters apart, where :func:`cut_fits` holds:
    the first fitting candidate past each ``piece`` characters."""
    start = 0
    while len(text) - start > piece:
        for found in _CANDIDATE.finditer(text, start + piece):
            if cut_fits(backend, text, found.end(), window):
                start = found.end()
                yield start
                break
        else:
            return


def encode_in_pieces(
    backend: Any,
    whole: Callable[[str], list[int]],
    text: str,
    dtype: np.dtype,
    piece: int = PIECE_CHARS,
    window: int = WINDOW_CHARS,
) -> np.ndarray | None:
    """The ids of ``whole(text)``, each piece of ``text`` encoded on its own (``backend``:
    the ``tokenizers.Tokenizer`` that ``whole`` runs); None where a piece-wise encoding
    is not provably the same (then encode it whole)."""
    if len(text) <= piece:
        return None
    affix = special_affix(backend, whole)  # first: transformers sets the backend's state
    config = json.loads(backend.to_str())
    if affix is None or not splits_cleanly(config):
        return None
    window = least_window(config, window)
    before, after = affix
    parts, start = [np.asarray(before, dtype=dtype)], 0
    for end in [*cuts(backend, text, piece, window), len(text)]:
        parts.append(np.asarray(_inner(backend, text[start:end]), dtype=dtype))
        start = end
    parts.append(np.asarray(after, dtype=dtype))
    return np.concatenate(parts)


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
        """Token ids of each text, whatever its length: a text longer than
        :data:`PIECE_CHARS` in pieces where that gives the
        same ids (:func:`encode_in_pieces`), else whole."""
        found: list[np.ndarray | None] = [None] * len(texts)
        backend, whole = self._pieces_backend()
        if backend is not None:
            for index, text in enumerate(texts):
                found[index] = encode_in_pieces(backend, whole, text, self.dtype, PIECE_CHARS)
        rest = [index for index, ids in enumerate(found) if ids is None]
        for index, ids in zip(rest, self._encode_whole([texts[i] for i in rest])):
            found[index] = ids
        return found  # type: ignore[return-value]  # every entry is set above

    def _pieces_backend(self) -> tuple[Any, Callable[[str], list[int]]]:
        """The ``tokenizers.Tokenizer`` that pieces are encoded with and the whole
        encoding it must match; (None, ...) for bytes and a slow tokenizer."""
        if self._tok is not None:
            return self._tok, lambda text: list(self._tok.encode(text).ids)
        if self.hf is not None and getattr(self.hf, "is_fast", False):
            hf = self.hf
            return hf.backend_tokenizer, lambda text: list(hf(text, verbose=False)["input_ids"])
        return None, list

    def _encode_whole(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text encoded as one string (``verbose=False``: transformers'
        warning of a text longer than the model's length is no concern of documents that
        ``--max-tokens`` chunks)."""
        if not texts:  # a tokenizer may fail on an empty batch
            return []
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
