"""The packed micro-batch that our models consume.

A micro-batch's samples are concatenated into one sequence of ``S`` tokens
(padding-free packing), optionally followed by one padding segment so that ``S``
divides the SP size. Per-token tensors have ``S`` (global) or ``S / sp`` (a
shard) rows; ``cu_seqlens`` and per-sample tensors always describe the whole
micro-batch, so a shard still knows the global layout.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

__all__ = ["IGNORE_INDEX", "PER_TOKEN_FIELDS", "PackedBatch", "segment_offsets"]

IGNORE_INDEX = -100
"""The target of a token that has none (the last token of a sample, padding): every loss
skips it (``cross_entropy(..., ignore_index=IGNORE_INDEX)``), and ``loss_mask`` is
``targets != IGNORE_INDEX``."""

PER_TOKEN_FIELDS = ("inputs", "targets", "position_ids", "segment_ids", "loss_mask")


@dataclass(frozen=True)
class PackedBatch:
    """Packed samples of one micro-batch.

    Fields (S = tokens of this batch or shard):
    - ``sample_ids``: dataset ids of the samples, in segment order;
    - ``cu_seqlens``: int64 ``(n_segments + 1,)`` boundaries over the *full* padded
      sequence; a trailing padding segment, if any, is the last one;
    - ``inputs``: ``(S,)`` token ids, or ``(S, C)`` noisy latents;
    - ``targets``: ``(S,)`` next-token labels, or ``(S, C)`` regression targets;
    - ``position_ids``: ``(S,)`` positions within the sample, or ``(S, 3)``
      (frame, row, column) for video; global, not shard-relative;
    - ``segment_ids``: ``(S,)`` index into ``sample_ids``, ``-1`` on padding;
    - ``loss_mask``: ``(S,)`` bool, tokens that carry loss (never padding);
    - ``sample_cond``: optional ``(n_samples,)`` per-sample conditioning (diffusion
      timesteps);
    - ``sample_context``: optional ``(n_samples, L, D)`` per-sample conditioning
      sequence (text embeddings that video models cross-attend to);
    - ``token_offset``: index of this shard's first token in the full sequence.
    """

    sample_ids: tuple[int, ...]
    cu_seqlens: torch.Tensor
    inputs: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    loss_mask: torch.Tensor
    sample_cond: torch.Tensor | None = None
    sample_context: torch.Tensor | None = None
    token_offset: int = 0

    def __post_init__(self) -> None:
        # Host offsets travel with cu_seqlens (segment_offsets), so no consumer reads a
        # device and a compiled block sees no data-dependent Python int.
        if self.cu_seqlens.device.type == "cpu" and not hasattr(self.cu_seqlens, "host_offsets"):
            self.cu_seqlens.host_offsets = tuple(self.cu_seqlens.tolist())

    @property
    def num_tokens(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def full_length(self) -> int:
        return int(self.cu_seqlens[-1])

    def slice_tokens(self, start: int, end: int) -> PackedBatch:
        """Rows ``start:end`` of every per-token tensor (a sequence shard)."""
        sliced = {name: getattr(self, name)[start:end] for name in PER_TOKEN_FIELDS}
        return replace(self, token_offset=self.token_offset + start, **sliced)

    def to(self, device: torch.device | str) -> PackedBatch:
        """This batch on ``device``. On CUDA the copies are asynchronous (pinned host
        memory) and ``cu_seqlens`` keeps its host-side offsets (:func:`segment_offsets`),
        so running the batch never waits for the device."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                moved[f.name] = host_to_device(value, torch.device(device))
        cu = moved["cu_seqlens"]
        if cu is not self.cu_seqlens:
            cu.host_offsets = segment_offsets(self.cu_seqlens)
        return replace(self, **moved)


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a host tensor goes to CUDA through pinned memory
    without blocking the host (a pageable copy would wait for the device's queue)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def segment_offsets(cu_seqlens: torch.Tensor) -> tuple[int, ...]:
    """The boundaries of ``cu_seqlens`` as host integers.

    Read from the host copy that :meth:`PackedBatch.to` keeps with a device
    ``cu_seqlens``; otherwise read from the tensor (which, on a device, waits for it).
    """
    known = getattr(cu_seqlens, "host_offsets", None)
    return known if known is not None else tuple(cu_seqlens.tolist())


def segment_bounds(cu_seqlens: torch.Tensor) -> tuple[int, int]:
    """``(total tokens, longest segment)`` of a packed layout (see :func:`segment_offsets`)."""
    offsets = segment_offsets(cu_seqlens)
    # a plain loop: max(..., default=) breaks a compiled graph (dynamo cannot trace it)
    longest = 0
    for a, b in zip(offsets[:-1], offsets[1:]):
        longest = max(longest, b - a)
    return offsets[-1], longest
