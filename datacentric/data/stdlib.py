"""The embedded real corpus: the Python standard library's own ``.py`` files, as bytes.

Every interpreter ships it, so tests and demos train on real text with a real,
long-tailed length distribution and nothing to download.

Rules (see ``docs/data.md``):
- files: every ``*.py`` below ``sysconfig.get_paths()["stdlib"]``, skipping the
  folders ``site-packages``, ``dist-packages`` and ``__pycache__`` and, unless
  ``include_tests=True``, the test folders ``test``, ``tests`` and ``idle_test``
  (some distributions strip them, so leaving them out keeps the corpus the same
  wherever the same Python version is installed);
- order: sorted POSIX relative paths; sample ids follow that order and, within a
  file, chunk order;
- tokens: one per byte (vocabulary 256);
- length cap ``max_tokens`` (default 8192): a longer file, by ``long_docs``: ``chunk``
  (default) makes it ``ceil(n / max_tokens)`` chunks of near-equal length (they differ
  by at most one byte), so no chunk is tiny and no byte is dropped; ``truncate`` keeps
  its first ``max_tokens`` bytes; ``skip`` leaves it out and reports it
  (``skipped_long``); ``error`` refuses it by name (the rules of every text source);
- empty files carry no token and are skipped; their paths are kept in
  ``skipped_empty`` and reported by :meth:`StdlibCorpus.summary`.
"""

from __future__ import annotations

import os
import statistics
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from datacentric.batch import PackedBatch
from datacentric.data.base import DataError, check_sample_ids
from datacentric.data.text import pack_token_samples
from datacentric.shapes import SampleShape

DEFAULT_MAX_TOKENS = 8192
"""Default length cap of one sample (bytes)."""

LONG_DOC_RULES = ("chunk", "truncate", "skip", "error")
"""What a text source does with a document longer than ``max_tokens``."""

SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
TEST_DIRS = frozenset({"test", "tests", "idle_test"})


@dataclass(frozen=True)
class ChunkInfo:
    """Where a sample comes from: bytes ``start:end`` of ``path`` (chunk ``chunk`` of
    ``num_chunks``)."""

    path: str
    chunk: int
    num_chunks: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(root: Path, include_tests: bool = False) -> list[str]:
    """Sorted POSIX paths (relative to ``root``) of the ``.py`` files of the corpus."""
    skipped = SKIPPED_DIRS if include_tests else SKIPPED_DIRS | TEST_DIRS
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skipped]
        rel = Path(folder).relative_to(root)
        found.extend((rel / name).as_posix() for name in files if name.endswith(".py"))
    return sorted(found)


def chunk_bounds(length: int, max_tokens: int) -> list[tuple[int, int]]:
    """Split ``length`` bytes into ``ceil(length / max_tokens)`` near-equal chunks."""
    count = -(-length // max_tokens)
    return [(j * length // count, (j + 1) * length // count) for j in range(count)]


class StdlibCorpus:
    """Byte-level text dataset of the standard library's source files.

    ``limit`` keeps only the first ``limit`` files of the sorted list (before
    chunking), for quick tests. Only file sizes are read at construction; a
    sample's bytes are read on demand.
    """

    def __init__(
        self,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        limit: int | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        include_tests: bool = False,
        long_docs: str = "chunk",
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if long_docs not in LONG_DOC_RULES:
            raise ValueError(f"--long-docs must be one of {', '.join(LONG_DOC_RULES)}")
        self.max_tokens = int(max_tokens)
        self.long_docs = long_docs
        self.root = Path(root) if root is not None else stdlib_root()
        if not self.root.is_dir():
            raise FileNotFoundError(f"standard-library folder not found: {self.root}")
        self.include_tests = include_tests
        files = list_source_files(self.root, include_tests)
        if limit is not None:
            files = files[: max(0, int(limit))]
        self.files: list[str] = []
        self.file_lengths: list[int] = []
        self.skipped_empty: list[str] = []
        self.skipped_long: list[str] = []
        self._chunks: list[ChunkInfo] = []
        for path in files:
            size = (self.root / path).stat().st_size
            if size == 0:
                self.skipped_empty.append(path)
                continue
            if size > self.max_tokens and long_docs != "chunk":
                if long_docs == "error":
                    raise DataError(
                        f"stdlib {path}: file of {size} bytes is longer than --max-tokens "
                        f"{self.max_tokens} (--long-docs error); raise --max-tokens or pass "
                        "--long-docs chunk, truncate or skip"
                    )
                if long_docs == "skip":
                    self.skipped_long.append(path)
                    continue
            self.files.append(path)
            self.file_lengths.append(size)
            bounds = chunk_bounds(size, self.max_tokens)
            if long_docs == "truncate":
                bounds = [(0, min(size, self.max_tokens))]
            for j, (start, end) in enumerate(bounds):
                self._chunks.append(ChunkInfo(path, j, len(bounds), start, end))
        if not self._chunks:
            raise ValueError(
                f"no non-empty .py files under {self.root} (limit={limit}, "
                f"{len(self.skipped_long)} longer than --max-tokens skipped)"
            )

    def __len__(self) -> int:
        return len(self._chunks)

    def shapes(self) -> list[SampleShape]:
        """Text shapes (token counts) of every sample, by sample id."""
        return [SampleShape.text(c.tokens) for c in self._chunks]

    def describe(self, sample_id: int) -> ChunkInfo:
        """The file and chunk that sample ``sample_id`` holds."""
        (sample_id,) = check_sample_ids([sample_id], len(self))
        return self._chunks[sample_id]

    def loss_tokens(self, sample_id: int) -> int:
        """Every byte but the last of the sample has a next-byte target."""
        return self.describe(sample_id).tokens - 1

    def sample(self, sample_id: int) -> torch.Tensor:
        """The bytes of sample ``sample_id`` as a uint8 tensor."""
        info = self.describe(sample_id)
        with open(self.root / info.path, "rb") as handle:
            handle.seek(info.start)
            data = handle.read(info.tokens)
        if len(data) != info.tokens:
            raise RuntimeError(
                f"{info.path} changed on disk: expected {info.tokens} bytes at {info.start}, "
                f"read {len(data)}"
            )
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples into a micro-batch: next-byte targets within each sample (the
        same in every epoch)."""
        ids = check_sample_ids(sample_ids, len(self))
        return pack_token_samples(ids, [self.sample(i) for i in ids], pad_to_multiple)

    def summary(self) -> dict[str, object]:
        """Facts of the corpus, for logs and docs (plain JSON-able values)."""
        lengths = [c.tokens for c in self._chunks]
        return {
            "python": sys.version.split()[0],
            "root": str(self.root),
            "include_tests": self.include_tests,
            "max_tokens": self.max_tokens,
            "files": len(self.files),
            "long_docs": self.long_docs,
            "skipped_empty": len(self.skipped_empty),
            "skipped_long": len(self.skipped_long),
            "samples_skipped": len(self.skipped_empty) + len(self.skipped_long),
            "files_split": sum(1 for n in self.file_lengths if n > self.max_tokens),
            "samples": len(lengths),
            "total_tokens": sum(lengths),
            "longest_file": max(self.file_lengths),
            "longest_sample": max(lengths),
            "median_sample": statistics.median(lengths),
            "shortest_sample": min(lengths),
        }
