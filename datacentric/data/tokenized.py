"""Tokenized text from files: token ids cached on disk, memory-mapped, one sample per
document (or chunk of a long document).

- Tokenizer: a local ``tokenizer.json`` through the ``tokenizers`` library (its own
  post-processing, e.g. special tokens, applies), a folder saved with ``save_pretrained``
  (through transformers' ``AutoTokenizer``, local files only, never its code), or UTF-8
  bytes (vocabulary 256).
- Conversations: records with ``messages`` (or ``prompt``/``completion``) are rendered
  with the tokenizer folder's chat template, the loss on the assistant's tokens by
  default (:mod:`datacentric.data.chat`); a conversation with no loss token is counted,
  not sampled, like an empty document.
- Cache: the token ids of every document are computed once and stored under
  ``$DATACENTRIC_CACHE`` (default ``~/.cache/datacentric``) in a folder named by a hash
  of (source kind, files with sizes and modification times, text field, tokenizer
  files: :func:`~datacentric.data.tokenizer_files.tokenizer_digest`); a changed file
  makes a new entry. ``tokens.bin`` is read through a
  memory map, so loading lengths never loads the corpus.
- Long documents (more than ``max_tokens``), by ``long_docs``: ``chunk`` (default)
  splits a document of ``n`` tokens into ``ceil(n / max_tokens)`` near-equal chunks
  (as the standard-library corpus does); ``truncate`` keeps its first ``max_tokens``;
  ``skip`` leaves it out and counts it; ``error`` raises :class:`DataError` naming it.
- Empty documents (no token) carry nothing to learn: they are counted, not sampled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from datacentric.batch import IGNORE_INDEX, PackedBatch
from datacentric.data.base import DataError, check_sample_ids
from datacentric.data.chat import ChatRenderer, chat_renderer
from datacentric.data.documents import (
    TOKEN_FIELD,
    first_record,
    is_conversation,
    loss_rule,
    read_documents,
    read_records,
    record_format,
    resolve_files,
)
from datacentric.data.render_limit import RenderDeadline, render_within
from datacentric.data.stdlib import DEFAULT_MAX_TOKENS, LONG_DOC_RULES
from datacentric.data.text import pack_token_samples
from datacentric.data.text_file import text_utf8
from datacentric.data.tokenizer_files import BYTES, TextCodec
from datacentric.data.tokenizer_files import text_codec as text_codec  # its old home
from datacentric.regular_files import check_regular
from datacentric.shapes import SampleShape

TEXT_KINDS = ("jsonl", "parquet", "text", "hf-datasets")
CACHE_VERSION = 7  # 2: every message key and record keyword; 3: tables without None;
# 4: text files keep their CRLF and CR line ends; 5: UTF-32 text files read as UTF-32;
# 6: pre-tokenized ids that are no whole numbers refused (2.5 was read as 2); 7: a
# record without them among pre-tokenized records refused (it was an empty document)
ENCODE_BATCH = 1024
#: The files of a cache entry.
CACHE_FILES = ("meta.json", "offsets.npy", "origins.npy", "tokens.bin", "mask.bin")
#: pre-tokenized records: the ids, and the masks that choose the tokens with loss
TOKEN_MASKS = ("labels", "completion_mask", "assistant_masks")


def cache_root() -> Path:
    """Folder of cached token arrays: ``$DATACENTRIC_CACHE`` or ``~/.cache/datacentric``."""
    return Path(os.environ.get("DATACENTRIC_CACHE") or Path.home() / ".cache" / "datacentric")


def _file_facts(path: str) -> list[object]:
    """(absolute path, size, mtime in ns) of a file, or of every file below a folder."""
    root = Path(path).resolve()
    found = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in found]


#: What each list of a pre-tokenized record holds, as its refusals say.
_ENTRIES = {TOKEN_FIELD: "a token id", "labels": "a token id or -100"}
_INT64 = 2**63


def _whole_number(value: object, mask: bool) -> bool:
    """An entry a pre-tokenized list may hold: an integer of 64 bits, or a float of
    one (``2.0``, as some writers write them); ``true``/``false`` in a mask only."""
    if isinstance(value, bool):
        return mask
    if isinstance(value, int):  # one past a float's range too (10**400)
        return -_INT64 <= value < _INT64
    return isinstance(value, float) and value.is_integer() and -_INT64 <= value < _INT64


def _whole_numbers(record, name: str, value: object) -> np.ndarray:
    """The list ``value`` of a pre-tokenized record's field ``name`` as int64;
    :class:`DataError` naming the record and the first entry that is no whole number
    (numpy would take 2.5 as 2, ``true`` as 1, ``"2"`` as 2, and flatten nested lists)."""
    if not isinstance(value, list | tuple):
        shown = json.dumps(value, ensure_ascii=False, default=repr)[:60]
        each = "token ids" if name in _ENTRIES else "0s and 1s"
        raise DataError(f"{record.where}: {name} is {shown}, not a list of {each}")
    if set(map(type, value)) <= {int}:  # the usual case, checked at C speed
        try:
            return np.asarray(value, dtype=np.int64)
        except OverflowError:
            pass
    mask = name not in _ENTRIES
    for index, entry in enumerate(value):
        if not _whole_number(entry, mask):
            shown = json.dumps(entry, ensure_ascii=False, default=repr)[:60]
            raise DataError(
                f"{record.where}: {name}[{index}] is {shown}, not "
                f"{_ENTRIES.get(name, '0 or 1')}; write each as a JSON integer"
            )
    return np.asarray(value, dtype=np.int64)


def token_record(record, enc: TextCodec) -> tuple[np.ndarray, np.ndarray]:
    """``(token ids, loss mask as uint8)`` of a pre-tokenized record: ``input_ids`` and
    the tokens its ``labels`` (not -100), ``completion_mask`` and ``assistant_masks``
    (each optional, 1 on a token that is predicted) all mark, as transformers' causal-LM
    loss and TRL's collator read them; the labels must be the ids where they count."""
    fields = record.fields
    if not isinstance(fields, dict) or TOKEN_FIELD not in fields:
        found = ", ".join(sorted(fields)) if isinstance(fields, dict) else type(fields).__name__
        raise DataError(
            f"{record.where}: no {TOKEN_FIELD} (found: {found}), though the first record "
            "of the dataset holds token ids; keep token records and text or conversations "
            "in datasets of their own"
        )
    ids = _whole_numbers(record, TOKEN_FIELD, fields[TOKEN_FIELD])
    if ids.size and (ids.min() < 0 or ids.max() >= enc.vocab_size):
        raise DataError(
            f"{record.where}: input_ids hold ids outside the tokenizer's vocabulary of "
            f"{enc.vocab_size}; pass the tokenizer the ids were made with (--tokenizer DIR)"
        )
    mask = np.ones(len(ids), dtype=bool)
    for name in TOKEN_MASKS:
        if fields.get(name) is None:
            continue
        values = _whole_numbers(record, name, fields[name])
        if len(values) != len(ids):
            raise DataError(
                f"{record.where}: {name} has {len(values)} entries for {len(ids)} input_ids; "
                "give one per token"
            )
        if name == "labels":
            kept = values != IGNORE_INDEX
            if (values[kept] != ids[kept]).any():
                raise DataError(
                    f"{record.where}: labels differ from input_ids where they are not -100; "
                    "give labels equal to input_ids, -100 on tokens without loss"
                )
            mask &= kept
        else:
            mask &= values != 0
    return ids.astype(enc.dtype), mask.astype(np.uint8)


def _chunks(
    kind: str,
    files: list[str],
    text_field: str,
    enc: TextCodec,
    renderer: ChatRenderer | None,
    tokens: bool = False,
):
    """``(file, row, token ids, assistant mask or None)`` of every document, in order
    (conversations when a ``renderer`` is given; pre-tokenized records when ``tokens``)."""
    if tokens:
        for record in read_records(kind, files):
            yield record.file, record.row, *token_record(record, enc)
        return
    if renderer is not None:
        with RenderDeadline() as deadline:
            for record in read_records(kind, files):
                if not is_conversation(record.fields):
                    raise DataError(
                        f"{record.where}: not a conversation (no messages, or prompt and "
                        "completion), though the first record of the dataset is one"
                    )
                yield (
                    record.file,
                    record.row,
                    *render_within(deadline, renderer, record, enc.dtype),
                )
        return
    if kind == "text" and enc.is_bytes:  # a file's ids are its bytes: no whole string held
        for index, path in enumerate(files):
            yield index, 0, np.frombuffer(text_utf8(path), dtype=np.uint8), None
        return
    pending = []

    def flush():
        if not pending:  # a tokenizer may fail on an empty batch
            return
        for doc, ids in zip(pending, enc.encode([d.text for d in pending])):
            yield doc.file, doc.row, ids, None
        pending.clear()

    for doc in read_documents(kind, files, text_field):
        pending.append(doc)
        if len(pending) >= ENCODE_BATCH:
            yield from flush()
    yield from flush()


def _build_cache(
    kind: str,
    files: list[str],
    text_field: str,
    enc: TextCodec,
    final: Path,
    renderer: ChatRenderer | None,
    fmt: str = "text",
) -> None:
    """Tokenize every document into ``final`` (written in a temporary folder, then renamed:
    concurrent builders of the same entry agree); conversations also write ``mask.bin``,
    one byte per token, 1 on the assistant's tokens."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    offsets, rows, file_of = [0], [], []
    try:
        with open(tmp / "tokens.bin", "wb") as out, open(tmp / "mask.bin", "wb") as masks:
            for file, row, ids, mask in _chunks(
                kind, files, text_field, enc, renderer, fmt == "tokens"
            ):
                out.write(np.ascontiguousarray(ids, dtype=enc.dtype))  # not copied again
                if mask is not None:
                    masks.write(np.ascontiguousarray(mask, dtype=np.uint8))
                offsets.append(offsets[-1] + len(ids))
                rows.append(row)
                file_of.append(file)
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        np.save(tmp / "origins.npy", np.asarray([file_of, rows], dtype=np.int64).reshape(2, -1))
        meta = {"dtype": enc.dtype.str, "vocab_size": enc.vocab_size, "files": files}
        meta["format"] = fmt
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same entry first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class TokenizedTextDataset:
    """Documents of JSONL / Parquet / text files or a saved ``datasets`` folder, tokenized
    and cached; sample ids follow files (sorted) then documents then chunks."""

    def __init__(
        self,
        kind: str,
        pattern: str,
        *,
        tokenizer: str | None = None,
        text_field: str = "text",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        long_docs: str = "chunk",
        limit: int | None = None,
        loss_on: str | None = None,
    ) -> None:
        if kind not in TEXT_KINDS:
            raise ValueError(f"unknown text source {kind!r}; use one of {', '.join(TEXT_KINDS)}")
        if long_docs not in LONG_DOC_RULES:
            raise ValueError(f"--long-docs must be one of {', '.join(LONG_DOC_RULES)}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.kind, self.pattern, self.text_field = kind, pattern, text_field
        self.max_tokens, self.long_docs = int(max_tokens), long_docs
        if kind == "hf-datasets":
            if not Path(pattern).is_dir():
                raise DataError(f"hf-datasets:{pattern}: no such folder")
            self.files = [pattern]
        else:
            self.files = resolve_files(kind, pattern)
        # what the files hold (their first record), then the tokenizer that reads them
        first = first_record(kind, self.files)  # read once: a table's first batch is large
        self.format = record_format(first, text_field)
        self.loss_on = loss_rule(loss_on, self.format, f"{kind}:{pattern}")
        enc = TextCodec(tokenizer)
        self.tokenizer, self.vocab_size = tokenizer, enc.vocab_size
        chat = self.format == "chat"
        renderer = chat_renderer(enc.hf, enc.path, self.files[first.file]) if chat else None
        if renderer is not None:
            renderer.check_loss_on(self.loss_on)
        field_key = text_field if self.format == "text" else self.format
        key = [CACHE_VERSION, kind, [_file_facts(f) for f in self.files], field_key, enc.digest]
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
        self.cache_dir = cache_root() / "tokens" / digest
        if not (self.cache_dir / "meta.json").is_file():
            _build_cache(kind, self.files, text_field, enc, self.cache_dir, renderer, self.format)
        for name in CACHE_FILES:  # a FIFO there would block the reads below
            check_regular(self.cache_dir / name)
        meta = json.loads((self.cache_dir / "meta.json").read_text(encoding="utf-8"))
        offsets = np.load(self.cache_dir / "offsets.npy")
        self._origins = np.load(self.cache_dir / "origins.npy")
        if limit is not None:
            offsets = offsets[: max(0, int(limit)) + 1]
        self._offsets = offsets
        total = int(offsets[-1]) if len(offsets) else 0
        self._tokens = (
            np.memmap(self.cache_dir / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r")
            if total
            else np.zeros(0, dtype=np.uint8)
        )
        self._split(np.diff(offsets))
        self._count_loss_tokens()

    def _split(self, lengths: np.ndarray) -> None:
        """Samples (document, start, end) of each document by the long-document rule."""
        cap, rule = self.max_tokens, self.long_docs
        long = lengths > cap
        if rule == "error" and long.any():
            doc = int(np.argmax(long))
            raise DataError(
                f"{self.origin(doc)}: document of {int(lengths[doc])} tokens is longer than "
                f"--max-tokens {cap} (--long-docs error); raise --max-tokens or pass "
                "--long-docs chunk, truncate or skip"
            )
        counts = np.where(lengths > 0, 1, 0)
        if rule == "chunk":
            counts = -(-lengths // cap)
        elif rule == "skip":
            counts = np.where(long, 0, counts)
        self.documents = int(len(lengths))
        self.skipped_empty = int((lengths == 0).sum())
        self.skipped_long = int((long & (counts == 0)).sum())
        self.long_documents = int(long.sum())
        doc = np.repeat(np.arange(len(lengths)), counts)
        if not len(lengths):
            raise DataError(f"{self.kind}:{self.pattern}: holds no document (its files are empty)")
        if not len(doc) and self.skipped_long:
            raise DataError(
                f"{self.kind}:{self.pattern}: every document with a token is longer than "
                f"--max-tokens {cap} ({self.skipped_long} of {self.documents}), and "
                "--long-docs skip leaves them out; raise --max-tokens or pass --long-docs "
                "chunk or truncate"
            )
        if not len(doc):
            raise DataError(f"{self.kind}:{self.pattern}: no document has any token")
        first = np.repeat(np.cumsum(counts) - counts, counts)
        j = np.arange(len(doc)) - first
        n, c = lengths[doc], counts[doc]
        start = j * n // c
        end = np.minimum((j + 1) * n // c, start + cap) if rule == "truncate" else (j + 1) * n // c
        base = self._offsets[doc]
        self._doc, self._start, self._end = doc, base + start, base + end

    def _count_loss_tokens(self) -> None:
        """Loss tokens of every sample; under assistant-only loss, samples without any
        are left out and counted (``skipped_no_loss``)."""
        self._loss = self._end - self._start - 1
        self.skipped_no_loss, self._mask = 0, None
        if self.loss_on != "assistant":
            return
        self._mask = np.memmap(self.cache_dir / "mask.bin", dtype=np.uint8, mode="r")
        marked = np.concatenate(([0], np.cumsum(self._mask, dtype=np.int64)))
        self._loss = marked[self._end] - marked[np.minimum(self._start + 1, self._end)]
        keep = self._loss > 0
        self.skipped_no_loss = int((~keep).sum())
        if not keep.any():
            raise DataError(
                f"{self.kind}:{self.pattern}: no conversation has an assistant token to train "
                "on (--loss-on assistant); check the roles, or pass --loss-on all"
            )
        self._doc, self._start, self._end = self._doc[keep], self._start[keep], self._end[keep]
        self._loss = self._loss[keep]

    def origin(self, doc: int) -> str:
        """Where document ``doc`` comes from: ``FILE:LINE`` (JSONL), ``FILE row R``, or ``FILE``."""
        path, row = self.files[int(self._origins[0, doc])], int(self._origins[1, doc])
        if self.kind == "jsonl":
            return f"{path}:{row}"
        return path if self.kind == "text" else f"{path} row {row}"

    def sample_source(self, sample_id: int) -> str:
        """Where sample ``sample_id`` comes from (its document's :meth:`origin`)."""
        (i,) = check_sample_ids([sample_id], len(self))
        return self.origin(int(self._doc[i]))

    def __len__(self) -> int:
        return len(self._doc)

    def shapes(self) -> list[SampleShape]:
        """Token counts of every sample, by sample id."""
        return [SampleShape.text(int(n)) for n in self._end - self._start]

    def loss_tokens(self, sample_id: int) -> int:
        """Tokens whose next-token target carries loss: every token but the last, or
        under assistant-only loss those that predict an assistant token."""
        (i,) = check_sample_ids([sample_id], len(self))
        return int(self._loss[i])

    def target_mask(self, sample_id: int) -> torch.Tensor | None:
        """Which tokens' targets carry loss (bool), or None when all but the last do."""
        if self._mask is None:
            return None
        (i,) = check_sample_ids([sample_id], len(self))
        marked = np.asarray(self._mask[self._start[i] + 1 : self._end[i]], dtype=bool)
        return torch.from_numpy(np.concatenate((marked, [False])))

    def sample(self, sample_id: int) -> torch.Tensor:
        """Token ids of sample ``sample_id`` (int64), read from the memory map."""
        (i,) = check_sample_ids([sample_id], len(self))
        return torch.from_numpy(np.asarray(self._tokens[self._start[i] : self._end[i]], np.int64))

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples (the same tokens in every epoch); each document or chunk is its
        own segment, so attention never crosses a document boundary."""
        ids = check_sample_ids(sample_ids, len(self))
        masks = [self.target_mask(i) for i in ids] if self._mask is not None else None
        return pack_token_samples(ids, [self.sample(i) for i in ids], pad_to_multiple, masks)

    def summary(self) -> dict[str, object]:
        """Facts of the dataset (JSON-able), skipped counts included."""
        lengths = self._end - self._start
        return {
            "source": f"{self.kind}:{self.pattern}",
            "files": len(self.files),
            "documents": self.documents,
            "samples": len(self),
            "total_tokens": int(lengths.sum()),
            "longest_sample": int(lengths.max()),
            "max_tokens": self.max_tokens,
            "long_docs": self.long_docs,
            "long_documents": self.long_documents,
            "skipped_long": self.skipped_long,
            "skipped_empty": self.skipped_empty,
            "skipped_no_loss": self.skipped_no_loss,
            "samples_skipped": self.skipped_long + self.skipped_empty + self.skipped_no_loss,
            "records": self.format,
            "loss_on": self.loss_on,
            "loss_tokens": int(self._loss.sum()),
            "tokenizer": self.tokenizer or BYTES,
            "vocab_size": self.vocab_size,
            "cache": str(self.cache_dir),
        }
