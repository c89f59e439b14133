"""A bucket's feasible options: the ways it can run, each with its time curve.

A :class:`BucketOption` is one (SP size, its split into Ulysses x ring, recomputation)
under a memory cap, with the
largest micro-batch of the bucket's representative (its largest member) that fits
and the pass time at ``1, 2, 4, ..., max_batch`` samples. The planner computes the
options of every bucket (:func:`evaluate_option`) and the
:class:`~datacentric.planning.plan.Plan` carries them; policies only choose among
them. The search functions here are the one place a configuration is searched.

**Splits.** A group of ``sp`` ranks runs Ulysses over ``u`` ranks inside a ring of
``r = sp / u`` (:func:`split_candidates`): Ulysses alone and a ring over the whole
group (inside a node too: a ring hides its K/V transfers behind attention where
Ulysses pays its all-to-alls in full); across nodes, or past the head count, also the
ring degree that keeps the largest Ulysses group the heads allow within one node. The
planner keeps, per (SP size, recomputation), the split with the fewest GPU-seconds
per sample, Ulysses on ties: where rings are not cheaper, options are as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datacentric.planning.cost_model import (
    CostModel,
    split_breakdown,
    split_memory_bytes,
    supports_split,
)
from datacentric.planning.heads import check_step_sp_sizes, mixable_sp_sizes
from datacentric.planning.heads import nesting_sp_sizes as nesting_sp_sizes  # its old home
from datacentric.shapes import SampleShape


def safe_time(
    cost_model: CostModel, shapes: Sequence[SampleShape], sp: int, rc: tuple, ring: int = 1
) -> float:
    """The pass time on ``sp`` ranks with a ring of ``ring``, or infinity when the model
    rejects the configuration (for instance an SP size that does not divide the heads)."""
    try:
        if ring == 1:
            return float(cost_model.pass_time_s(shapes, sp, rc))
        return float(split_breakdown(cost_model, shapes, sp, rc, ring).time_s)
    except ValueError:
        return float("inf")


def fits_shapes(
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    sp: int,
    rc: tuple,
    cap: int,
    ring: int = 1,
) -> bool:
    """Whether one micro-batch of ``shapes`` fits under ``cap`` bytes per rank."""
    try:
        return split_memory_bytes(cost_model, shapes, sp, rc, ring) <= cap
    except ValueError:
        return False


def split_candidates(cost_model: CostModel, sp: int) -> list[int]:
    """The ring degrees the planner tries on ``sp`` ranks (see the module doc), those
    the cost model prices, Ulysses alone (1) first; empty when none runs."""
    node = cost_model.gpus_per_node
    tried = [1]
    if sp > node or not supports_split(cost_model, sp, 1):
        within = [u for u in range(min(sp, node), 0, -1) if sp % u == 0]
        hybrid = next((sp // u for u in within if supports_split(cost_model, sp, sp // u)), None)
        tried.append(hybrid)
    tried.append(sp)  # a ring over the whole group (inside a node it hides its transfers)
    return [r for r in dict.fromkeys(tried) if r is not None and supports_split(cost_model, sp, r)]


def accepted_splits(cost_model: CostModel, sp: int) -> list[int]:
    """Every ring degree a group of ``sp`` ranks can run, ascending: each divisor of
    ``sp`` (what ``Assignment`` and the runtime's process groups accept) that the cost
    model prices (its heads divide the Ulysses degree ``sp / r``, the model's largest
    ring). The proved bound minimises over all of them, the planner over
    :func:`split_candidates` (a subset)."""
    return [r for r in range(1, sp + 1) if sp % r == 0 and supports_split(cost_model, sp, r)]


def max_batch(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    rc: tuple,
    cap: int,
    limit: int,
    guess: int = 1,
    ring: int = 1,
) -> int:
    """Most samples of ``shape`` per micro-batch that fit (0: not even one) on ``sp``
    ranks with a ring of ``ring``.

    Gallops from ``guess`` (doubling up while it fits, halving down while it does
    not), then bisects, so the answer is exact, not a power of two; a good guess
    (the answer for a similar shape) makes it a handful of memory queries.
    """
    good, bad = 0, limit + 1
    probe = max(1, min(int(guess), limit))
    while bad - good > 1:
        if fits_shapes(cost_model, [shape] * probe, sp, rc, cap, ring):
            good = probe
            probe = min(2 * probe, bad - 1) if bad == limit + 1 else (good + bad) // 2
        else:
            bad = probe
            probe = max(probe // 2, good + 1) if good == 0 else (good + bad) // 2
        if probe <= good or probe >= bad:
            probe = (good + bad) // 2
    return good


@dataclass(frozen=True)
class BucketOption:
    """One way to run a bucket: SP size, recomputation and the largest micro-batch,
    with the pass time at sample counts ``counts`` (``1, 2, 4, ..., max_batch``);
    ``ring_size`` is the ring degree of the group's split (1: Ulysses only; the
    Ulysses degree is ``sp_size / ring_size``)."""

    sp_size: int
    recompute: tuple[bool, ...]
    max_batch: int
    counts: tuple[float, ...]
    times: tuple[float, ...]
    ring_size: int = 1
    _arrays: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        arrays = (np.asarray(self.counts, float), np.asarray(self.times, float))
        object.__setattr__(self, "_arrays", arrays)

    def time(self, count: float) -> float:
        """Estimated pass time of ``count`` representatives (fractional allowed)."""
        counts, times = self._arrays
        if count >= 1.0 or len(counts) == 1:
            return float(np.interp(count, counts, times))
        # Below one representative: extend the first segment, never below proportional.
        slope = float(times[1] - times[0])
        return max(float(times[0]) + (count - 1.0) * slope, float(times[0]) * count)

    def times_for(self, counts: np.ndarray) -> np.ndarray:
        """:meth:`time` of every entry of ``counts``, infinite above ``max_batch``."""
        xs, ys = self._arrays
        counts = np.asarray(counts, dtype=float)
        out = np.interp(counts, xs, ys)
        low = counts < 1.0
        if low.any() and len(xs) > 1:
            slope = float(ys[1] - ys[0])
            t0 = float(ys[0])
            out[low] = np.maximum(t0 + (counts[low] - 1.0) * slope, t0 * counts[low])
        out[counts > self.max_batch] = np.inf
        return out

    def batch_for_time(self, seconds: float) -> int:
        """Most samples per micro-batch whose estimated time stays within ``seconds``
        (at least 1)."""
        xs, ys = self._arrays
        if seconds <= ys[0]:
            return 1
        if seconds >= ys[-1]:
            return self.max_batch
        return max(1, int(np.interp(seconds, ys, xs)))

    @property
    def gpu_seconds_per_sample(self) -> float:
        """GPU-seconds per sample at the largest micro-batch."""
        return self.sp_size * float(self.times[-1]) / self.max_batch

    def to_json(self) -> dict[str, Any]:
        return {
            "sp_size": self.sp_size,
            "recompute": "".join("1" if r else "0" for r in self.recompute),
            "max_batch": self.max_batch,
            "counts": list(self.counts),
            "times_s": list(self.times),
            **({"ring": self.ring_size} if self.ring_size > 1 else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BucketOption:
        return cls(
            sp_size=int(d["sp_size"]),
            recompute=tuple(c == "1" for c in d["recompute"]),
            max_batch=int(d["max_batch"]),
            counts=tuple(float(c) for c in d["counts"]),
            times=tuple(float(t) for t in d["times_s"]),
            ring_size=int(d.get("ring", 1)),
        )


def evaluate_option(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    rc: tuple,
    cap: int,
    limit: int,
    *,
    guess: int = 1,
    curve: bool = True,
    ring: int | None = 1,
) -> BucketOption | None:
    """The :class:`BucketOption` of ``shape`` at ``(sp, rc)`` with a ring of ``ring``
    (None: the cheapest of ``sp``'s :func:`split_candidates`, Ulysses alone on ties),
    or None if nothing fits. Without ``curve`` only the largest micro-batch is timed."""
    if ring is None:
        found = (
            evaluate_option(cost_model, shape, sp, rc, cap, limit, guess=guess, curve=curve, ring=r)
            for r in split_candidates(cost_model, sp)
        )
        return cheapest([option for option in found if option is not None])
    top = max_batch(cost_model, shape, sp, rc, cap, limit, guess, ring)
    if top == 0:
        return None
    counts = [1] if curve else [top]
    while counts[-1] * 2 < top:
        counts.append(counts[-1] * 2)
    if counts[-1] != top:
        counts.append(top)
    times = [safe_time(cost_model, [shape] * k, sp, rc, ring) for k in counts]
    if not np.isfinite(times[-1]):
        return None
    return BucketOption(sp, tuple(rc), top, tuple(map(float, counts)), tuple(times), ring)


def cheapest(options: Sequence[BucketOption]) -> BucketOption | None:
    """The option with the fewest GPU-seconds per sample (the first on ties)."""
    best: BucketOption | None = None
    for option in options:
        if best is None or option.gpu_seconds_per_sample < best.gpu_seconds_per_sample:
            best = option
    return best


def cheapest_option(
    cost_model: CostModel,
    shape: SampleShape,
    sp: int,
    recomputes: Sequence[tuple[bool, ...]],
    cap: int,
    limit: int,
    *,
    guesses: dict[tuple[bool, ...], int] | None = None,
    curve: bool = True,
) -> BucketOption | None:
    """Among ``recomputes``, the option of ``shape`` at ``sp`` with the fewest
    GPU-seconds per sample (None if none fits). ``guesses`` (per recomputation, a
    micro-batch size near the answer) is updated with the sizes found."""
    found = []
    for rc in dict.fromkeys(recomputes):
        guess = guesses.get(rc, 1) if guesses is not None else 1
        option = evaluate_option(
            cost_model, shape, sp, rc, cap, limit, guess=guess, curve=curve, ring=None
        )
        if guesses is not None and option is not None:
            guesses[rc] = option.max_batch
        if option is not None:
            found.append(option)
    return cheapest(found)


def sp_size_tiers(
    cost_model: CostModel, world_size: int, sp_sizes: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """The SP sizes a bucket may be planned on, split into (within a node, across
    nodes), ascending: ``sp_sizes`` or every size a step may use
    (:func:`~datacentric.planning.heads.mixable_sp_sizes`), that the model runs with
    some split (:func:`split_candidates`). A size a step cannot use raises ``ValueError``."""
    sizes = sorted(set(sp_sizes)) if sp_sizes else mixable_sp_sizes(world_size)
    check_step_sp_sizes(world_size, sizes)
    sizes = [s for s in sizes if split_candidates(cost_model, s)]
    node = cost_model.gpus_per_node
    return [s for s in sizes if s <= node], [s for s in sizes if s > node]
