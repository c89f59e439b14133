"""A start-up check that a model follows the packed contract, on two real samples.

A model trained data-centrically sees packed micro-batches and sequence shards. It
is exact only if (1) positions come from ``batch.position_ids`` (global positions
within each sample, also on a shard) and (2) attention stays within the samples
that ``batch.cu_seqlens`` delimits. A model that keeps its own ``arange``
positions, or attends across samples, still trains, with a plausible loss and
wrong gradients. Both mistakes show on one forward pass of two samples:

- *boundaries*: a sample's per-token losses packed after another sample equal its
  losses alone;
- *positions*: with an attention callable that returns the queries (so each
  token's output depends only on that token and its position), the rows of a
  sequence shard equal the same rows of the whole sequence.

:func:`check_model_contract` raises :class:`ModelContractError` naming the check.
It costs three small forward passes, without gradients. A model that declares
``rebuilds_whole_samples = True`` gathers every shard's samples whole from its SP group
and takes positions from its own ``forward`` (the diffusers adapter); a shard without its
group has no meaning there, so only the boundary check runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from datacentric.data.base import Dataset


class ModelContractError(ValueError):
    """A model that would train with wrong gradients under packing or sharding."""


def _queries(q_SHD, k_SHD, v_SHD, cu_seqlens, causal, *, window=None):  # noqa: ANN001
    """An attention callable whose output is its queries (per token, position-aware)."""
    return q_SHD


def current_attention(model: nn.Module):  # noqa: ANN201
    """The attention callable ``model`` uses now (to restore it after the check)."""
    for sub in model.modules():  # the model first, then its layers
        exposed = isinstance(getattr(type(sub), "attention", None), property)
        if exposed or callable(sub.__dict__.get("attention")):
            return sub.attention
    raise ModelContractError(
        f"{type(model).__name__}: no attention callable found (set_attention(fn) must store "
        "it as an 'attention' attribute of the model or of its attention layers)"
    )


def _pick_samples(dataset: Dataset, count: int) -> list[int]:
    shapes = dataset.shapes()
    order = sorted(range(len(shapes)), key=lambda i: shapes[i].tokens)
    usable = [i for i in order if shapes[i].tokens >= 4]
    if len(usable) < count:
        raise ModelContractError(f"the check needs {count} samples of 4 tokens or more")
    return usable[:count]


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= rtol * max(scale, 1e-12)


@torch.no_grad()
def check_model_contract(
    model: nn.Module,
    dataset: Dataset,
    *,
    sample_ids: Sequence[int] | None = None,
    rtol: float = 1e-4,
) -> None:
    """Raise :class:`ModelContractError` if ``model`` ignores sample boundaries or
    the batch's positions (see the module docstring). ``sample_ids`` picks the two
    samples (default: the two shortest with at least 4 tokens)."""
    first, second = sample_ids if sample_ids is not None else _pick_samples(dataset, 2)
    name = type(model).__name__
    device = next(model.parameters()).device

    def pack(ids: list[int], multiple: int):  # noqa: ANN202
        return dataset.pack(ids, multiple).to(device)

    was_training = model.training
    model.eval()
    try:
        alone = model(pack([second], 1)).float()
        packed_batch = pack([first, second], 1)
        packed = model(packed_batch).float()
        start = int(packed_batch.cu_seqlens[1])
        if not _close(packed[start : start + alone.shape[0]], alone, rtol):
            raise ModelContractError(
                f"{name}: sample {second}'s loss changes when packed after sample {first}: "
                "the model attends across samples or ignores batch.position_ids; route "
                "attention through set_attention(fn) with batch.cu_seqlens and take "
                "positions from batch.position_ids (docs/models.md)"
            )
        if getattr(model, "rebuilds_whole_samples", False):
            return
        previous = current_attention(model)
        model.set_attention(_queries)
        try:
            batch = pack([first], 2)
            half = batch.num_tokens // 2
            whole = model(batch).float()
            shard = model(batch.slice_tokens(half, batch.num_tokens)).float()
        finally:
            model.set_attention(previous)
        if not _close(shard, whole[half:], rtol):
            raise ModelContractError(
                f"{name}: a sequence shard of sample {first} gives other values than the "
                "same tokens of the whole sample: the model computes positions itself "
                "instead of reading batch.position_ids (global positions within each "
                "sample, also on a shard); see docs/models.md"
            )
    finally:
        model.train(was_training)
