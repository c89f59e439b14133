"""Sharding a packed micro-batch across the ranks of its SP group.

The packer pads a micro-batch's full sequence to a multiple of the SP size with
one trailing padding segment (``segment_ids == -1``, ``loss_mask`` false), so
every rank gets the same number of tokens. Rank ``i`` of a group of ``sp`` takes
the contiguous tokens ``[i*S/sp, (i+1)*S/sp)``: per-token tensors are sliced,
while ``cu_seqlens``, ``position_ids`` values (global positions within each
sample) and per-sample tensors keep describing the whole micro-batch, which is
what Ulysses attention and RoPE need. Padding never carries loss.

A hybrid group of ``u x r`` ranks with a ring (``ring > 1``) shards by the ring's
zigzag layout instead (``ring_layout``): ring position ``j`` holds its tokens in its
local order, and its ``u`` adjacent ranks take contiguous pieces of them. Such a shard
is not a contiguous slice; models only need per-token tensors and global
``position_ids``, so the order does not matter to them.
"""

from __future__ import annotations

from dataclasses import replace

from datacentric.batch import PER_TOKEN_FIELDS, PackedBatch, segment_offsets
from datacentric.parallel.groups import split_position
from datacentric.parallel.ring_layout import ring_layout


def shard_bounds(num_tokens: int, rank_in_group: int, sp_size: int) -> tuple[int, int]:
    """Token range ``[start, end)`` of shard ``rank_in_group`` out of ``sp_size``."""
    if not 0 <= rank_in_group < sp_size:
        raise ValueError(f"rank {rank_in_group} is outside an SP group of size {sp_size}")
    if num_tokens % sp_size:
        raise ValueError(
            f"a packed sequence of {num_tokens} tokens cannot be split across SP size "
            f"{sp_size}; pack it with pad_to_multiple={sp_size}"
        )
    per_rank = num_tokens // sp_size
    return rank_in_group * per_rank, (rank_in_group + 1) * per_rank


def shard_batch(batch: PackedBatch, rank_in_group: int, sp_size: int, ring: int = 1) -> PackedBatch:
    """This rank's shard of a full packed micro-batch: contiguous tokens, or with a
    ``ring`` of more than one position, its piece of the ring layout (module doc).

    ``batch`` must be the whole micro-batch (``token_offset == 0`` and as many
    tokens as ``cu_seqlens`` covers); with ``sp_size == 1`` it is returned as is.
    """
    if batch.token_offset != 0 or batch.num_tokens != batch.full_length:
        raise ValueError(
            f"shard_batch needs a whole micro-batch, got {batch.num_tokens} of "
            f"{batch.full_length} tokens at offset {batch.token_offset}"
        )
    if bool(batch.loss_mask[batch.segment_ids < 0].any()):
        raise ValueError("padding tokens (segment_ids == -1) must not carry loss")
    start, end = shard_bounds(batch.num_tokens, rank_in_group, sp_size)
    if sp_size == 1:
        return batch
    if ring == 1:
        return batch.slice_tokens(start, end)
    position, ulysses_rank = split_position(rank_in_group, sp_size, ring)
    tokens = ring_layout(segment_offsets(batch.cu_seqlens), ring).tokens(position)
    piece = len(tokens) * ring // sp_size
    index = tokens[ulysses_rank * piece : (ulysses_rank + 1) * piece]
    # token_offset names a contiguous shard's first token; a ring shard has none
    return replace(batch, **{name: getattr(batch, name)[index] for name in PER_TOKEN_FIELDS})
