"""Packing of byte/token sequences for the causal LM, and a synthetic text dataset.

Targets are the next token *within the same sample*: the last token of every
sample has no target (``IGNORE_INDEX``, loss mask False), and so has padding.
Positions restart at 0 for every sample (and for the padding segment).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from datacentric.batch import IGNORE_INDEX, PackedBatch
from datacentric.data.base import (
    ShapeListDataset,
    check_sample_ids,
    sample_generator,
    segment_layout,
)
from datacentric.shapes import SampleShape


def pack_token_samples(
    sample_ids: Sequence[int],
    tokens: Sequence[torch.Tensor],
    pad_to_multiple: int = 1,
    target_masks: Sequence[torch.Tensor | None] | None = None,
) -> PackedBatch:
    """Pack 1D token tensors (one per sample, in order) into a micro-batch.

    ``inputs`` are the tokens (int64, padding 0); ``targets[i]`` is the next token
    of the same sample or ``IGNORE_INDEX``; ``loss_mask`` is ``targets != IGNORE_INDEX``.
    ``target_masks`` (one bool tensor per sample, or None) keeps only the targets where
    it is True (assistant-only loss); the others become ``IGNORE_INDEX``.
    """
    if len(tokens) != len(sample_ids):
        raise ValueError(f"got {len(tokens)} token tensors for {len(sample_ids)} sample ids")
    layout = segment_layout(sample_ids, [int(t.numel()) for t in tokens], pad_to_multiple)
    inputs, targets, positions = [], [], []
    ignore_one = torch.full((1,), IGNORE_INDEX, dtype=torch.long)
    masks = target_masks if target_masks is not None else [None] * len(tokens)
    for sample, keep in zip(tokens, masks):
        sample = sample.reshape(-1).long()
        inputs.append(sample)
        target = torch.cat((sample[1:], ignore_one))
        if keep is not None:
            target = torch.where(keep.reshape(-1), target, IGNORE_INDEX)
        targets.append(target)
        positions.append(torch.arange(sample.numel(), dtype=torch.long))
    if layout.padding:
        inputs.append(torch.zeros(layout.padding, dtype=torch.long))
        targets.append(torch.full((layout.padding,), IGNORE_INDEX, dtype=torch.long))
        positions.append(torch.arange(layout.padding, dtype=torch.long))
    targets_S = torch.cat(targets)
    return PackedBatch(
        sample_ids=layout.sample_ids,
        cu_seqlens=layout.cu_seqlens,
        inputs=torch.cat(inputs),
        targets=targets_S,
        position_ids=torch.cat(positions),
        segment_ids=layout.segment_ids,
        loss_mask=targets_S != IGNORE_INDEX,
    )


class SyntheticTextDataset(ShapeListDataset):
    """Random byte sequences of given lengths, deterministic in (seed, sample id).

    For profiling and simulation workloads whose lengths come from elsewhere (a
    lengths file, a distribution); the real text corpus is :class:`StdlibCorpus`.
    """

    def __init__(self, shapes: Sequence[SampleShape], vocab_size: int = 256, seed: int = 0):
        super().__init__(shapes, seed)
        self.vocab_size = vocab_size

    def loss_tokens(self, sample_id: int) -> int:
        """Every token but the last has a next-token target."""
        return self.shape(sample_id).tokens - 1

    def sample(self, sample_id: int) -> torch.Tensor:
        """Tokens of sample ``sample_id`` (int64)."""
        n = self.shape(sample_id).tokens
        gen = sample_generator(self.seed, sample_id)
        return torch.randint(0, self.vocab_size, (n,), generator=gen, dtype=torch.long)

    def pack(
        self, sample_ids: Sequence[int], pad_to_multiple: int = 1, *, epoch: int = 0
    ) -> PackedBatch:
        """Pack samples (the same tokens in every epoch)."""
        ids = check_sample_ids(sample_ids, len(self))
        return pack_token_samples(ids, [self.sample(i) for i in ids], pad_to_multiple)
