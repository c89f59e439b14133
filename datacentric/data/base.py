"""The dataset protocol and the segment layout shared by every packer.

A dataset knows the shape and the loss-token count of each sample (by id, without
loading it) and packs
any list of sample ids into one :class:`~datacentric.batch.PackedBatch`:
samples concatenated in the given order, then at most one padding segment so
that the packed length is a multiple of ``pad_to_multiple`` (the SP size).
``pack`` takes the epoch as a keyword (default 0) so that per-epoch draws (noise,
diffusion time, crops) change between epochs; :func:`epoch_pack` binds it for
callers that pack with two positional arguments, also for datasets without it.
:class:`SampleSubset` shows some samples of any dataset as a dataset of its own (the
parts of a held-out split, :mod:`datacentric.data.holdout`, or the first of a held-out set).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import torch

from datacentric.batch import PackedBatch
from datacentric.progress import counted
from datacentric.shapes import SampleShape


@runtime_checkable
class Dataset(Protocol):
    """What the planner, scheduler and runtime need of a dataset."""

    def __len__(self) -> int: ...

    def shapes(self) -> list[SampleShape]:
        """The shape of every sample, indexed by sample id."""
        ...

    def loss_tokens(self, sample_id: int) -> int:
        """Tokens of the sample that carry loss (what its packed ``loss_mask`` holds);
        known without loading the sample, so loss weights cost nothing."""
        ...

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples (in this order) into one padded micro-batch; ``epoch`` seeds
        per-epoch draws (a dataset without any may omit the keyword)."""
        ...


class DataError(ValueError):
    """Bad input data: the message names the file (and line or row) and the fix."""


Pack = Callable[[Sequence[int], int], PackedBatch]
"""``pack(sample_ids, pad_to_multiple) -> PackedBatch`` with the epoch bound."""


def epoch_pack(dataset: Dataset, epoch: int) -> Pack:
    """``dataset.pack`` with ``epoch`` bound; datasets whose ``pack`` has no ``epoch``
    keyword (written before it existed) get their plain ``pack``."""
    try:
        takes_epoch = "epoch" in inspect.signature(dataset.pack).parameters
    except (TypeError, ValueError):
        takes_epoch = False
    if not takes_epoch:
        return dataset.pack

    def pack(sample_ids: Sequence[int], pad_to_multiple: int = 1) -> PackedBatch:
        return dataset.pack(sample_ids, pad_to_multiple, epoch=epoch)

    return pack


def padded_length(tokens: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is at least ``tokens``."""
    if multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {multiple}")
    return -(-tokens // multiple) * multiple


@dataclass(frozen=True)
class SegmentLayout:
    """Where each sample of a packed micro-batch lies.

    ``cu_seqlens`` has one boundary per sample plus, when ``padding > 0``, one for
    the trailing padding segment; ``segment_ids`` is the sample's index in
    ``sample_ids`` for every token and ``-1`` on padding.
    """

    sample_ids: tuple[int, ...]
    lengths: tuple[int, ...]
    padding: int
    cu_seqlens: torch.Tensor
    segment_ids: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Tokens of samples (without padding)."""
        return sum(self.lengths)

    @property
    def total(self) -> int:
        """Packed length including padding."""
        return self.num_tokens + self.padding


def check_sample_ids(sample_ids: Sequence[int], size: int) -> tuple[int, ...]:
    """Validate ids against a dataset of ``size`` samples (non-empty, in range)."""
    ids = tuple(int(i) for i in sample_ids)
    if not ids:
        raise ValueError("cannot pack an empty list of samples")
    bad = [i for i in ids if not 0 <= i < size]
    if bad:
        raise IndexError(
            f"sample id(s) {bad[:5]} out of range for a dataset of {counted(size, 'sample')}"
        )
    return ids


def segment_layout(
    sample_ids: Sequence[int], lengths: Sequence[int], pad_to_multiple: int = 1
) -> SegmentLayout:
    """The layout of samples of ``lengths`` packed in order, padded to a multiple."""
    lengths = tuple(int(n) for n in lengths)
    if len(lengths) != len(sample_ids) or not lengths:
        raise ValueError(f"need one length per sample, got {len(lengths)} for {len(sample_ids)}")
    if min(lengths) < 1:
        raise ValueError(f"every packed sample needs at least one token, got lengths {lengths}")
    real = sum(lengths)
    padding = padded_length(real, pad_to_multiple) - real
    bounds = [0]
    for n in lengths + ((padding,) if padding else ()):
        bounds.append(bounds[-1] + n)
    segment_ids = torch.repeat_interleave(
        torch.arange(len(lengths), dtype=torch.long), torch.tensor(lengths, dtype=torch.long)
    )
    segment_ids = torch.cat((segment_ids, torch.full((padding,), -1, dtype=torch.long)))
    return SegmentLayout(
        sample_ids=tuple(int(i) for i in sample_ids),
        lengths=lengths,
        padding=padding,
        cu_seqlens=torch.tensor(bounds, dtype=torch.long),
        segment_ids=segment_ids,
    )


def sample_generator(seed: int, sample_id: int, epoch: int = 0) -> torch.Generator:
    """A generator seeded only by (dataset seed, sample id, epoch): rank-independent
    draws (epoch 0 gives the same stream as before epochs existed)."""
    # Mix into one 63-bit seed (golden-ratio multiplier spreads nearby seeds).
    mixed = int(seed) * 0x9E3779B97F4A7C15 + int(sample_id) * 0xBF58476D1CE4E5B9
    mixed = (mixed + int(epoch) * 0x94D049BB133111EB) % (2**63)
    return torch.Generator().manual_seed(mixed)


class ShapeListDataset:
    """Base of the synthetic datasets: samples defined by a list of shapes and a seed."""

    is_video: bool = False
    """Whether every shape must be a video grid (else every shape must be text)."""

    def __init__(self, shapes: Sequence[SampleShape], seed: int = 0) -> None:
        self._shapes = list(shapes)
        if not self._shapes:
            raise ValueError(f"{type(self).__name__} needs at least one sample shape")
        wrong = [i for i, s in enumerate(self._shapes) if s.is_video != self.is_video]
        if wrong:
            kind = "text" if self.is_video else "video"
            raise ValueError(f"{type(self).__name__} got {kind} shapes (sample ids {wrong[:5]})")
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self._shapes)

    def shapes(self) -> list[SampleShape]:
        return list(self._shapes)

    def shape(self, sample_id: int) -> SampleShape:
        """Shape of sample ``sample_id`` (range-checked)."""
        (sample_id,) = check_sample_ids([sample_id], len(self))
        return self._shapes[sample_id]


class SampleSubset:
    """The samples ``ids`` of ``dataset`` as a dataset of their own (id ``k`` is the
    parent's ``ids[k]``); anything else is read from the parent (its tokenizer, vocabulary
    size, summary)."""

    def __init__(self, dataset: Dataset, ids: Sequence[int]) -> None:
        self.dataset = dataset
        self.ids = check_sample_ids(ids, len(dataset))
        self._shapes = dataset.shapes()

    def __len__(self) -> int:
        return len(self.ids)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("dataset", "ids"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def parent_id(self, sample_id: int) -> int:
        """The parent dataset's id of this subset's sample ``sample_id``."""
        (sample_id,) = check_sample_ids([sample_id], len(self))
        return self.ids[sample_id]

    def shapes(self) -> list[SampleShape]:
        return [self._shapes[i] for i in self.ids]

    def loss_tokens(self, sample_id: int) -> int:
        parent = self.parent_id(sample_id)
        direct = getattr(self.dataset, "loss_tokens", None)
        if callable(direct):
            return int(direct(parent))
        return int(self.dataset.pack([parent], 1).loss_mask.sum())

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        ids = check_sample_ids(sample_ids, len(self))
        batch = epoch_pack(self.dataset, epoch)([self.ids[i] for i in ids], pad_to_multiple)
        return replace(batch, sample_ids=ids)
