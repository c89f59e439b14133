"""Sample shapes and shape buckets.

A sample is either a 1D token sequence (text) or a video latent grid of
``frames x height x width`` patches. Attention sees ``tokens`` positions in both
cases; for video, ``tokens == frames * height * width``.

Buckets group samples of similar shape so that a plan (SP size, micro-batch size,
recomputation) is chosen once per bucket. Every bucket carries a representative
shape that is the *largest* shape it contains, so a plan made for the
representative is safe (memory) for every member.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from datacentric.regular_files import read_regular_text


@dataclass(frozen=True, order=True)
class SampleShape:
    """The shape of one sample as attention sees it.

    ``grid`` is ``None`` for text, or ``(frames, height, width)`` in latent patches
    for video. ``tokens`` is the sequence length attention runs over.
    """

    tokens: int
    grid: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"a sample needs at least one token, got tokens={self.tokens}")
        if self.grid is not None:
            f, h, w = self.grid
            if min(f, h, w) < 1 or f * h * w != self.tokens:
                raise ValueError(
                    f"video grid {self.grid} must be positive with frames*height*width == "
                    f"tokens ({self.tokens})"
                )

    @classmethod
    def text(cls, tokens: int) -> SampleShape:
        """A 1D sequence of ``tokens`` tokens."""
        return cls(tokens=int(tokens))

    @classmethod
    def video(cls, frames: int, height: int, width: int) -> SampleShape:
        """A latent video of ``frames x height x width`` patches."""
        f, h, w = int(frames), int(height), int(width)
        return cls(tokens=f * h * w, grid=(f, h, w))

    @property
    def is_video(self) -> bool:
        return self.grid is not None

    def to_json(self) -> int | list[int]:
        """Compact JSON form: an int for text, ``[f, h, w]`` for video."""
        return self.tokens if self.grid is None else list(self.grid)

    @classmethod
    def from_json(cls, value: int | Sequence[int]) -> SampleShape:
        if isinstance(value, int):
            return cls.text(value)
        if len(value) != 3:
            raise ValueError(f"a video shape is [frames, height, width], got {value!r}")
        return cls.video(*value)


def parse_lengths_line(line: str, line_number: int = 0) -> SampleShape:
    """Parse one line of a lengths file: ``TOKENS`` or ``FRAMES HEIGHT WIDTH``."""
    parts = line.split()
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    try:
        if len(numbers) == 1:
            return SampleShape.text(numbers[0])
        if len(numbers) == 3:
            return SampleShape.video(*numbers)
    except ValueError as err:  # zero or negative sizes
        raise ValueError(f"line {line_number}: {err} (in {line!r})") from None
    raise ValueError(
        f"line {line_number}: expected a token count or 'frames height width', got {line!r}"
    )


def read_lengths_file(path: str) -> list[SampleShape]:
    """Read sample shapes, one per non-empty, non-comment line (sample id = order)."""
    shapes: list[SampleShape] = []
    try:
        text = read_regular_text(path).removeprefix("\ufeff")  # a BOM an editor wrote
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.split("#", 1)[0].strip()
        if stripped:
            try:
                shapes.append(parse_lengths_line(stripped, number))
            except ValueError as err:
                raise ValueError(f"{path}: {err}") from None
    if not shapes:
        raise ValueError(f"{path}: no samples (the lengths file is empty)")
    return shapes


@dataclass(frozen=True)
class Bucket:
    """A named group of sample shapes, planned through its largest member ``shape``."""

    name: str
    shape: SampleShape


@dataclass(frozen=True)
class Bucketing:
    """Buckets of a dataset and, for every sample id, the index of its bucket."""

    buckets: tuple[Bucket, ...]
    bucket_of_sample: tuple[int, ...]

    def members(self) -> list[list[int]]:
        """Sample ids of each bucket, in id order."""
        out: list[list[int]] = [[] for _ in self.buckets]
        for sample_id, b in enumerate(self.bucket_of_sample):
            out[b].append(sample_id)
        return out


def stable_order(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """Positions ordered by their bucket number: ``np.argsort(codes, kind="stable")`` of
    integer ``codes`` in ``[0, n_codes)`` (bucket numbers, one per sample), the same order
    (a stable sort has one answer), sorted as the narrowest unsigned type that holds them,
    which numpy sorts by radix (a million bucket numbers: about a seventh of the time of sorting
    them as 64-bit integers). The dataset view's bucket members and the data order's
    interleaving by bucket sort with it."""
    for narrow in (np.uint8, np.uint16):
        if n_codes <= np.iinfo(narrow).max + 1:
            return np.argsort(codes.astype(narrow), kind="stable")
    return np.argsort(codes, kind="stable")


def default_text_boundaries(max_tokens: int, smallest: int = 256) -> list[int]:
    """Powers of two from ``smallest`` up to at least ``max_tokens`` (bucket upper bounds)."""
    bounds = [smallest]
    while bounds[-1] < max_tokens:
        bounds.append(bounds[-1] * 2)
    return bounds


def make_buckets(
    shapes: Sequence[SampleShape], text_boundaries: Sequence[int] | None = None
) -> Bucketing:
    """Group samples into buckets.

    Text samples go to the smallest boundary (an upper bound on tokens) that holds
    them, which names the bucket (``t<=8192``); its representative is its longest
    member (4,096 documents of 5,700 tokens are planned as 5,700 tokens, not 8,192, so
    two of them fit one micro-batch recomputing one block). Video samples get one
    bucket per distinct grid. Buckets are sorted by tokens.
    """
    if not shapes:
        raise ValueError("cannot bucket an empty dataset: there are no samples")
    text_max = max((s.tokens for s in shapes if not s.is_video), default=0)
    bounds = sorted(text_boundaries) if text_boundaries else default_text_boundaries(text_max)
    if text_max > (bounds[-1] if bounds else 0):
        raise ValueError(
            f"a text sample has {text_max} tokens, above the largest bucket boundary "
            f"{bounds[-1]}; add a larger boundary"
        )
    longest: dict[SampleShape, int] = {}  # per text boundary: its longest member
    key_of: dict[int, SampleShape] = {}  # per text length: its boundary
    videos: set[SampleShape] = set()
    for s in shapes:  # each distinct length is placed once
        if s.is_video:
            videos.add(s)
        elif s.tokens not in key_of:
            key = key_of[s.tokens] = SampleShape.text(bounds[bisect.bisect_left(bounds, s.tokens)])
            longest[key] = max(longest.get(key, 0), s.tokens)
    distinct = sorted(set(key_of.values()) | videos, key=lambda s: (s.tokens, s.grid or (0, 0, 0)))
    index = {shape: i for i, shape in enumerate(distinct)}
    buckets = tuple(
        Bucket(name=bucket_name(s), shape=SampleShape.text(longest[s]) if s in longest else s)
        for s in distinct
    )
    of_length = {t: index[key] for t, key in key_of.items()}
    of_sample = tuple(index[s] if s.is_video else of_length[s.tokens] for s in shapes)
    return Bucketing(buckets=buckets, bucket_of_sample=of_sample)


def bucket_name(shape: SampleShape) -> str:
    """Readable bucket name: ``t<=4096`` for text, ``v{f}x{h}x{w}`` for video."""
    if shape.grid is None:
        return f"t<={shape.tokens}"
    f, h, w = shape.grid
    return f"v{f}x{h}x{w}"
