"""What one sample costs at best: the search the certified bound is made of.

A bucket's options are planned on its representative (its boundary), so a shorter
member run under them may recompute more than it needs. The ideal bound must not
inherit that: :func:`sample_price` searches, for one sample *shape*, every SP size a
step may use and every split into Ulysses x ring the cost model prices, and on each
the largest micro-batch without recomputation, and one sample and the largest
micro-batch that fits with every block recomputing, each with the fastest
recomputation that fits (:func:`~datacentric.planning.planner.choose_recompute`:
none when it fits, else the knapsack); it returns the fewest GPU-seconds per
sample. Intermediate micro-batch sizes are not searched: at one recomputation a
sample's share of a pass does not grow with the micro-batch (fixed costs are
shared), so the largest stands for them; one between the largest without
recomputation and the largest with every block, recomputing only some, could in
principle cost less than both ends, which the knapsack's choice at the ends
approximates. Past the point where :data:`PRUNE_AFTER` sizes in a row cost more
than the best, larger sizes are not priced (they only add communication).
:func:`fastest_run` is the shortest time of one such sample alone.

**Length classes.** Text members are priced per class of lengths within a factor
:data:`CLASS_RATIO` of each other, each class at its *shortest* member: a longer
sample never costs less on the same configuration (time and memory grow with
tokens), so every member's price is at least its class's and the sum is a lower
bound on any schedule's GPU-seconds. Buckets with at most :data:`EXACT_LENGTHS`
distinct lengths are priced at every length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datacentric.planning.bucket_options import (
    accepted_splits,
    max_batch,
    safe_time,
    split_candidates,
)
from datacentric.planning.cost_model import CostModel
from datacentric.planning.planner import choose_recompute
from datacentric.shapes import SampleShape

#: Buckets with at most this many distinct lengths are priced at each of them.
EXACT_LENGTHS = 32
#: Otherwise lengths within this factor share a class, priced at its shortest member.
CLASS_RATIO = 1.01
#: The search over SP sizes (ascending) stops after this many sizes in a row that
#: cost more than the best found (past that, larger groups only add communication).
PRUNE_AFTER = 2


def sample_price(
    cost_model: CostModel,
    shape: SampleShape,
    sizes: Sequence[int],
    cap: int,
    limit: int,
    guesses: dict[tuple, tuple[int, int]] | None = None,
) -> float:
    """Fewest GPU-seconds per sample of ``shape`` over the configurations on ``sizes``
    under ``cap`` bytes per rank, micro-batches up to ``limit`` (module doc); infinity
    where nothing fits. ``guesses`` (per size, split and recomputation, the largest
    micro-batch found and its sample's tokens) starts each search near its answer and
    is updated: pricing lengths in order costs a few memory queries each."""
    blocks = cost_model.num_blocks
    none, full = (False,) * blocks, (True,) * blocks
    guesses = {} if guesses is None else guesses
    best, worse = float("inf"), 0
    for sp in sizes:
        here = float("inf")
        for ring in split_candidates(cost_model, sp):
            tops = {none: 0, full: 0}
            for rc in (none, full):
                if rc == full and tops[none] >= limit:
                    break  # nothing recomputing runs more samples
                # near the answer for this size at another length, else another size's
                bs, tokens = guesses.get((sp, ring, rc), guesses.get(rc, (1, shape.tokens)))
                guess = max(1, bs * tokens // max(1, shape.tokens))
                if (sp, ring, rc) not in guesses and rc in guesses:
                    guess = max(1, guess * sp // guesses[(rc, "sp")][0])
                tops[rc] = max_batch(cost_model, shape, sp, rc, cap, limit, guess, ring)
                if tops[rc]:
                    guesses[(sp, ring, rc)] = guesses[rc] = (tops[rc], shape.tokens)
                    guesses[(rc, "sp")] = (sp, 0)
            if tops[none]:
                t = safe_time(cost_model, [shape] * tops[none], sp, none, ring)
                here = min(here, sp * t / tops[none])
            for k in dict.fromkeys((1, tops[full])) if tops[full] > tops[none] else ():
                choice = choose_recompute(cost_model, [shape] * k, sp, cap, ring)
                if choice is not None:
                    here = min(here, sp * choice.time_s / k)
        worse = worse + 1 if np.isfinite(best) and here > best else 0
        best = min(best, here)
        if worse >= PRUNE_AFTER:
            break
    return best


def fastest_run(cost_model: CostModel, shape: SampleShape, sizes: Sequence[int], cap: int) -> float:
    """Shortest time of one sample of ``shape`` alone on any of ``sizes`` and every
    split a group of each runs (:func:`~datacentric.planning.bucket_options.accepted_splits`),
    with the fastest recomputation that fits (infinity where nothing fits)."""
    best = float("inf")
    for sp in sizes:
        for ring in accepted_splits(cost_model, sp):
            choice = choose_recompute(cost_model, [shape], sp, cap, ring)
            if choice is not None:
                best = min(best, choice.time_s)
    return best


def length_classes(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lengths each class of ``lengths`` is priced at (ascending) and, per entry
    of ``lengths``, its class (module doc)."""
    distinct, inverse = np.unique(lengths, return_inverse=True)
    if len(distinct) <= EXACT_LENGTHS:
        return distinct, inverse.reshape(-1)
    key = np.floor(np.log(distinct) / np.log(CLASS_RATIO)).astype(np.int64)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    class_of_distinct = np.cumsum(np.r_[True, key[1:] != key[:-1]]) - 1
    return distinct[first], class_of_distinct[inverse.reshape(-1)]
