"""Per-bucket cost tables: what each bucket costs at each SP size, cached.

Everything the policies know about time and memory comes from the
:class:`~datacentric.planning.cost_model.CostModel` protocol, asked once per
(bucket, SP size, recomputation, micro-batch size) on the bucket's representative
(its largest member, so the answer is memory-safe for every member), and cached
here. Policies then estimate a micro-batch by interpolating in the number of
samples (or, for text buckets whose members differ, in tokens over the
representative's tokens); the final ``MicroBatch.est_time_s`` is the cost model's
own answer on the actual shapes (:meth:`DatasetView.exact_time`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from datacentric.planning.cost_model import CostModel
from datacentric.shapes import SampleShape


def safe_time(cost_model: CostModel, shapes: Sequence[SampleShape], sp: int, rc: tuple) -> float:
    """``pass_time_s``, or infinity when the model rejects the configuration
    (for instance an SP size that does not divide the heads)."""
    try:
        return float(cost_model.pass_time_s(shapes, sp, rc))
    except ValueError:
        return float("inf")


def fits_shapes(
    cost_model: CostModel, shapes: Sequence[SampleShape], sp: int, rc: tuple, cap: int
) -> bool:
    """Whether one micro-batch of ``shapes`` fits under ``cap`` bytes per rank."""
    try:
        return int(cost_model.pass_memory_bytes(shapes, sp, rc)) <= cap
    except ValueError:
        return False


def fits(
    cost_model: CostModel, shape: SampleShape, count: int, sp: int, rc: tuple, cap: int
) -> bool:
    """Whether ``count`` samples of ``shape`` in one micro-batch fit under ``cap``."""
    return fits_shapes(cost_model, [shape] * count, sp, rc, cap)


def max_batch(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    rc: tuple,
    cap: int,
    limit: int,
    guess: int = 1,
) -> int:
    """Most samples of ``shape`` per micro-batch that fit (0: not even one).

    Gallops from ``guess`` (doubling up while it fits, halving down while it does
    not), then bisects, so the answer is exact, not a power of two; a good guess
    (the answer for a similar shape) makes it a handful of memory queries.
    """
    good, bad = 0, limit + 1
    probe = max(1, min(int(guess), limit))
    while bad - good > 1:
        if fits(cost_model, shape, probe, sp, rc, cap):
            good = probe
            probe = min(2 * probe, bad - 1) if bad == limit + 1 else (good + bad) // 2
        else:
            bad = probe
            probe = max(probe // 2, good + 1) if good == 0 else (good + bad) // 2
        if probe <= good or probe >= bad:
            probe = (good + bad) // 2
    return good


@dataclass(frozen=True)
class Config:
    """One way to run a bucket: SP size, recomputation and the largest micro-batch,
    with the pass time at sample counts ``1, 2, 4, ..., max_batch``."""

    sp: int
    recompute: tuple[bool, ...]
    max_batch: int
    counts: np.ndarray
    times: np.ndarray

    def time(self, count: float) -> float:
        """Estimated pass time of ``count`` representatives (fractional allowed)."""
        if count >= 1.0 or len(self.counts) == 1:
            return float(np.interp(count, self.counts, self.times))
        # Below one representative: extend the first segment, never below proportional.
        slope = float(self.times[1] - self.times[0])
        return max(float(self.times[0]) + (count - 1.0) * slope, float(self.times[0]) * count)

    def times_for(self, counts: np.ndarray) -> np.ndarray:
        """:meth:`time` of every entry of ``counts``, infinite above ``max_batch``."""
        counts = np.asarray(counts, dtype=float)
        out = np.interp(counts, self.counts, self.times)
        low = counts < 1.0
        if low.any() and len(self.counts) > 1:
            slope = float(self.times[1] - self.times[0])
            t0 = float(self.times[0])
            out[low] = np.maximum(t0 + (counts[low] - 1.0) * slope, t0 * counts[low])
        out[counts > self.max_batch] = np.inf
        return out

    def batch_for_time(self, seconds: float) -> int:
        """Most samples per micro-batch whose estimated time stays within ``seconds``
        (at least 1)."""
        if seconds <= self.times[0]:
            return 1
        if seconds >= self.times[-1]:
            return self.max_batch
        return max(1, int(np.interp(seconds, self.times, self.counts)))

    @property
    def gpu_seconds_per_sample(self) -> float:
        """GPU-seconds per sample at the largest micro-batch."""
        return self.sp * float(self.times[-1]) / self.max_batch


def evaluate_config(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    rc: tuple,
    cap: int,
    limit: int,
    *,
    guess: int = 1,
    curve: bool = True,
) -> Config | None:
    """The :class:`Config` of ``shape`` at ``(sp, rc)``, or None if nothing fits.
    Without ``curve`` only the largest micro-batch is timed."""
    top = max_batch(cost_model, shape, sp, rc, cap, limit, guess)
    if top == 0:
        return None
    counts = [1] if curve else [top]
    while counts[-1] * 2 < top:
        counts.append(counts[-1] * 2)
    if counts[-1] != top:
        counts.append(top)
    times = [safe_time(cost_model, [shape] * k, sp, rc) for k in counts]
    if not np.isfinite(times[-1]):
        return None
    return Config(sp, rc, top, np.asarray(counts, float), np.asarray(times, float))


def best_config(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    recomputes: Sequence[tuple[bool, ...]],
    cap: int,
    limit: int,
    *,
    guesses: dict[tuple[bool, ...], int] | None = None,
    curve: bool = True,
) -> Config | None:
    """Among ``recomputes``, the config of ``shape`` at ``sp`` with the fewest
    GPU-seconds per sample (None if none fits). ``guesses`` (per recomputation, a
    micro-batch size near the answer) is updated with the sizes found."""
    best: Config | None = None
    for rc in dict.fromkeys(recomputes):
        guess = guesses.get(rc, 1) if guesses is not None else 1
        cfg = evaluate_config(cost_model, shape, sp, rc, cap, limit, guess=guess, curve=curve)
        if guesses is not None and cfg is not None:
            guesses[rc] = cfg.max_batch
        if cfg is not None and (
            best is None or cfg.gpu_seconds_per_sample < best.gpu_seconds_per_sample
        ):
            best = cfg
    return best


def candidate_sp_sizes(world_size: int, gpus_per_node: int, max_sp: int | None) -> list[int]:
    """SP sizes that can share one iteration: powers of two dividing the world (they
    nest, so any mix tiles the ranks aligned), capped at ``max_sp`` (default a node)."""
    cap = max_sp if max_sp is not None else max(1, gpus_per_node)
    sizes = [1]
    while world_size % (sizes[-1] * 2) == 0 and sizes[-1] * 2 <= min(cap, world_size):
        sizes.append(sizes[-1] * 2)
    return sizes


def chain_sizes(world_size: int) -> list[int]:
    """Every SP size allowed at ``world_size`` in a mixed iteration: the powers of two
    that divide it, plus the whole world (one group)."""
    sizes = candidate_sp_sizes(world_size, world_size, world_size)
    if sizes[-1] != world_size:
        sizes.append(world_size)
    return sizes
