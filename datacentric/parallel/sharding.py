"""Sharding a packed micro-batch across the ranks of its SP group.

The packer pads a micro-batch's full sequence to a multiple of the SP size with
one trailing padding segment (``segment_ids == -1``, ``loss_mask`` false), so
every rank gets the same number of tokens. Rank ``i`` of a group of ``sp`` takes
the contiguous tokens ``[i*S/sp, (i+1)*S/sp)``: per-token tensors are sliced,
while ``cu_seqlens``, ``position_ids`` values (global positions within each
sample) and per-sample tensors keep describing the whole micro-batch, which is
what Ulysses attention and RoPE need. Padding never carries loss.
"""

from __future__ import annotations

from datacentric.batch import PackedBatch


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


def shard_batch(batch: PackedBatch, rank_in_group: int, sp_size: int) -> PackedBatch:
    """This rank's contiguous shard of a full packed micro-batch.

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
    return batch.slice_tokens(start, end)
