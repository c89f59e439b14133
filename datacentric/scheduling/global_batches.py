"""Cutting an epoch into global batches, and the stratified order of its samples."""

from __future__ import annotations

import numpy as np

from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.policy_input import PolicyInput


def default_tokens_per_iteration(view: DatasetView, active: np.ndarray, world_size: int) -> int:
    """``world * max(2**18, longest sample)`` tokens: each rank gets at least one
    longest sample's worth of work, and a quarter-million tokens otherwise."""
    longest = int(view.tokens[active].max())
    return world_size * max(2**18, longest)


def batch_weights(inp: PolicyInput, order: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-sample weight and the bound of the global batch, in tokens or samples."""
    opts = inp.options
    if opts.samples_per_iteration is not None:
        return np.ones(len(order), dtype=np.int64), int(opts.samples_per_iteration)
    bound = opts.tokens_per_iteration or default_tokens_per_iteration(
        inp.view, inp.active, inp.world_size
    )
    return inp.view.tokens[order], int(bound)


def chunk_fixed(inp: PolicyInput, order: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """Consecutive global batches of ``order``, each closed when the next sample would
    pass the bound (a sample larger than the bound makes a batch alone); the last,
    partial batch is dropped when the options ask for it."""
    weights, bound = batch_weights(inp, order)
    chunks: list[np.ndarray] = []
    start, used = 0, 0
    for i, w in enumerate(weights.tolist()):
        if i > start and used + w > bound:
            chunks.append(order[start:i])
            start, used = i, 0
        used += w
    last = order[start:]
    if inp.options.drop_remainder and used < bound and chunks:
        return chunks, last.tolist()
    chunks.append(last)
    return chunks, []


def chunk_even(inp: PolicyInput, order: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """``ceil(total / bound)`` global batches of nearly equal weight (so no tiny last
    one); with ``drop_remainder``, ``floor(total / bound)`` full batches and the rest
    of ``order`` dropped."""
    weights, bound = batch_weights(inp, order)
    cum = np.cumsum(weights)
    total = int(cum[-1])
    dropped: list[int] = []
    if inp.options.drop_remainder and total >= bound:
        k = total // bound
        keep = int(np.searchsorted(cum, k * bound, side="right"))
        dropped = order[keep:].tolist()
        order, cum, total = order[:keep], cum[:keep], int(cum[keep - 1])
    else:
        k = max(1, -(-total // bound))
    cuts = np.searchsorted(cum, total * np.arange(1, k) / k, side="left") + 1
    chunks = [c for c in np.split(order, cuts) if len(c)]
    return chunks, dropped


def stratified_order(inp: PolicyInput) -> np.ndarray:
    """The active samples interleaved so that every stretch holds each bucket in
    proportion to its size (each bucket shuffled; bucket ``b``'s ``i``-th sample sits
    at ``(i + u_b) / n_b`` with a random offset ``u_b``)."""
    view, rng = inp.view, inp.rng
    active = inp.active
    buckets = view.bucket_of[active]
    counts = np.bincount(buckets, minlength=len(view.buckets))
    perm = rng.permutation(len(active))
    shuffled, bshuf = active[perm], buckets[perm]
    by_bucket = np.argsort(bshuf, kind="stable")
    rank = np.empty(len(active), dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1]
    rank[by_bucket] = np.arange(len(active)) - starts[bshuf[by_bucket]]
    offset = rng.random(len(view.buckets))
    key = (rank + offset[bshuf]) / counts[bshuf]
    return shuffled[np.argsort(key, kind="stable")]
