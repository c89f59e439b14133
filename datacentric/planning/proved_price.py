"""The proved per-sample price: what any pass charges a sample, fixed costs shared.

A cost model that offers ``pass_floor(shapes, sp_size, recompute, *, ring_size=1) ->
(seconds, bytes)`` (the analytic model does) promises, for every micro-batch ``B``
(a multiset of samples) on a configuration ``k`` (SP size, split, recomputation):

1. ``time(B) >= floor_s(B)`` and ``memory(B) >= floor_b(B)``;
2. superadditivity over samples: ``floor_s(B) - floor_s({}) >= sum over s in B of
   (floor_s({s}) - floor_s({}))``, the same for bytes, and every term non-negative.

Write ``F = floor_s({})`` (the pass's fixed costs), ``M0 = floor_b({})``,
``f_s = floor_s({s}) - F`` and ``m_s = floor_b({s}) - M0``. A pass that fits the cap
has ``sum m_s <= cap - M0``, so ``F >= F * sum m_s / (cap - M0)`` and

    sp * time(B) >= sum over s in B of sp * (f_s + F * m_s / (cap - M0)).

The price of a sample is the least right-hand term over every configuration on which
it fits alone (``m_s <= cap - M0``: no pass holding it can fit otherwise): every
micro-batch size and mix is covered, since its price does not depend on the others in
the pass. Summed over a step's samples it is at most the GPU-seconds of any schedule
of that step, so over the world at most its makespan (:mod:`datacentric.scheduling.measures`).

Recomputation is searched over every count per block kind (the floor is affine in the
counts; memory too once any block recomputes, so the counts' grid is priced from a
few evaluations), and a text sample's floor is a polynomial of degree two in its
length (linear and quadratic work), so every distinct length is priced exactly from
three evaluations per configuration. ``tests/pure/planning/test_proved_price.py``
checks both properties on the model and searches small instances exhaustively for a
schedule below the bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from datacentric.planning.bucket_options import accepted_splits
from datacentric.planning.cost_model import CostModel
from datacentric.shapes import SampleShape

#: Lengths a text sample's floor is interpolated from (a polynomial of degree two).
REFERENCE_TOKENS = (1024.0, 4096.0, 16384.0)
#: Above this many recomputation settings (counts per kind) no proved price is made.
MAX_GRID = 200_000
#: Prices are shaved by this share so float rounding never lifts one above a schedule.
SHAVE = 1e-9


def has_floor(cost_model: CostModel) -> bool:
    """Whether ``cost_model`` offers the ``pass_floor`` the proved price needs."""
    return callable(getattr(cost_model, "pass_floor", None))


def count_grid(cost_model: CostModel) -> tuple[np.ndarray, list[str], list[str], list[int]]:
    """Every recomputation setting by count per block kind (rows of the array), the
    kinds' names, every block's kind and the number of blocks of each kind."""
    kinds = list(getattr(cost_model, "block_kinds", ()) or ("block",) * cost_model.num_blocks)
    names = list(dict.fromkeys(kinds))
    sizes = [kinds.count(k) for k in names]
    grid = np.array(list(itertools.product(*(range(n + 1) for n in sizes))), dtype=float)
    return grid, names, kinds, sizes


def _flags(counts: Sequence[int], names: list[str], kinds: list[str]) -> tuple[bool, ...]:
    """Recompute flags with the first ``counts[i]`` blocks of kind ``names[i]`` on."""
    left = dict(zip(names, counts))
    out = []
    for kind in kinds:
        out.append(left[kind] > 0)
        left[kind] -= int(left[kind] > 0)
    return tuple(out)


def _basis(sizes: list[int]) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]]:
    """Count vectors to evaluate and, per kind, (point, point + one of that kind)
    indices into them giving its memory slope (``(-1, -1)`` when none is needed)."""
    k = len(sizes)
    unit = [tuple(int(i == j) for i in range(k)) for j in range(k)]
    points: list[tuple[int, ...]] = [(0,) * k, *unit]
    slopes = []
    for j in range(k):
        if sizes[j] >= 2:
            points.append(tuple(2 * int(i == j) for i in range(k)))
            slopes.append((1 + j, len(points) - 1))
        elif k > 1:
            other = (j + 1) % k
            points.append(tuple(int(i in (j, other)) for i in range(k)))
            slopes.append((1 + other, len(points) - 1))
        else:
            slopes.append((-1, -1))
    return points, slopes


def _on_grid(values: np.ndarray, grid: np.ndarray, slopes: list[tuple[int, int]]):
    """Seconds and bytes on every grid row from ``values`` (basis points x items x 2):
    seconds affine in the counts; bytes affine once any block recomputes."""
    base_s, base_b = values[0, :, 0], values[0, :, 1]
    secs = base_s[None, :] + sum(
        grid[:, [j]] * (values[1 + j, :, 0] - base_s)[None, :] for j in range(grid.shape[1])
    )
    anchor = values[1, :, 1]  # one block of the first kind
    byts = np.repeat(anchor[None, :], len(grid), axis=0)
    for j, (lo, hi) in enumerate(slopes):
        if lo < 0:
            continue
        slope = values[hi, :, 1] - values[lo, :, 1]
        byts = byts + (grid[:, [j]] - (1.0 if j == 0 else 0.0)) * slope[None, :]
    none = ~grid.any(axis=1)
    byts[none] = base_b[None, :]
    return secs, byts


def proved_prices(
    cost_model: CostModel,
    shapes: Sequence[SampleShape],
    sizes: Sequence[int],
    cap: int,
    recompute: str | None = None,
) -> np.ndarray | None:
    """Per shape, its proved price in GPU-seconds (module doc) over the SP sizes
    ``sizes`` and every split a group of each runs
    (:func:`~datacentric.planning.bucket_options.accepted_splits`: every ring degree
    dividing it that the model prices, inside a node too), under ``cap`` bytes per rank;
    infinity where it fits nothing; ``None`` when the model offers no floor.
    ``recompute``: ``"none"`` or ``"full"`` prices only passes recomputing no block or
    every block (a policy that runs one of them for all data); default every count."""
    if not has_floor(cost_model):
        return None
    grid, names, kinds, counts = count_grid(cost_model)
    if len(grid) > MAX_GRID:
        return None
    if recompute not in (None, "none", "full"):
        raise ValueError(f"recompute must be None, 'none' or 'full', got {recompute!r}")
    excluded = np.zeros(len(grid), dtype=bool)
    if recompute == "none":
        excluded = grid.any(axis=1)
    elif recompute == "full":
        excluded = (grid < np.asarray(counts, dtype=float)).any(axis=1)
    points, slopes = _basis(counts)
    flags = [_flags(p, names, kinds) for p in points]
    text = np.array([i for i, s in enumerate(shapes) if s.grid is None], dtype=np.int64)
    other = np.array([i for i, s in enumerate(shapes) if s.grid is not None], dtype=np.int64)
    powers = np.vander(np.array([shapes[i].tokens for i in text], dtype=float), 3)
    best = np.full(len(shapes), np.inf)
    for sp in sizes:
        for ring in accepted_splits(cost_model, sp):
            floor = _floor_at(cost_model, sp, ring)
            fixed_s, fixed_b, text_polynomials = _configuration(
                cost_model, (sp, ring, cap), floor, flags, grid, slopes
            )
            room = cap - fixed_b[:, 0]
            blocks = []
            if len(text):
                poly_s, poly_b = text_polynomials()
                blocks.append((text, poly_s @ powers.T, poly_b @ powers.T))
            if len(other):
                values = np.array([[floor((shapes[i],), f, False) for i in other] for f in flags])
                blocks.append((other, *_on_grid(values, grid, slopes)))
            for rows, secs, byts in blocks:
                m = np.maximum(byts - fixed_b, 0.0)
                fits = (m <= room[:, None] * (1 + 1e-12) + 1.0) & (room[:, None] > 0)
                share = np.minimum(1.0, m / np.where(room > 0, room, 1.0)[:, None])
                price = sp * (secs - fixed_s + fixed_s * share)
                fits &= ~excluded[:, None]
                price = np.where(fits, price, np.inf).min(axis=0)
                best[rows] = np.minimum(best[rows], price)
    return best * (1.0 - SHAVE)


def _configuration(cost_model: CostModel, key: tuple, floor, flags, grid, slopes):
    """The fixed costs (seconds and bytes per grid row) of the configuration ``key``
    (SP size, ring degree, cap) and a function giving its :func:`_text_polynomials`:
    what every price on it shares, whatever the samples, so kept on the cost model
    (made once per model, the bound of every step asks again)."""
    memo = cost_model.__dict__.get("_proved_configurations")
    if memo is None:
        memo = {}
        object.__setattr__(cost_model, "_proved_configurations", memo)  # frozen ones too
    found = memo.get(key)
    if found is None:
        empty = np.array([[floor((), f, False)] for f in flags])  # points x 1 x 2
        polynomials: list = []

        def text_polynomials():
            if not polynomials:
                polynomials.append(_text_polynomials(floor, flags, grid, slopes, key[2], key[1]))
            return polynomials[0]

        found = memo[key] = (*_on_grid(empty, grid, slopes), text_polynomials)
    return found


def _floor_at(cost_model: CostModel, sp: int, ring: int):
    """``pass_floor`` on ``sp`` ranks, with a ring of ``ring`` (passed only above 1,
    with ``ring_linear`` as asked)."""
    floor = cost_model.pass_floor  # type: ignore[attr-defined]
    if ring == 1:
        return lambda shapes, flags, linear: floor(shapes, sp, flags)  # noqa: ARG005
    return lambda shapes, flags, linear: floor(
        shapes, sp, flags, ring_size=ring, ring_linear=linear
    )


def _text_polynomials(floor, flags, grid, slopes, cap, ring):
    """Per grid row, the coefficients (of ``t**2``, ``t``, 1) of a text sample's floor
    seconds and bytes in its length ``t``, through :data:`REFERENCE_TOKENS`. On a ring,
    a row charges the steps' exposed transfer linearly (``ring_linear``) where that is
    never below leaving it out for any length that fits the row alone (the difference
    is concave in ``t`` and 0 at ``t = 0``, so checking the longest that fits is
    enough): the choice depends on the row, never on the samples, as the proof needs."""
    ref = np.array(REFERENCE_TOKENS)
    inverse = np.linalg.inv(np.vander(ref, 3))

    def coefficients(linear: bool):
        measured = np.array(
            [[floor((SampleShape.text(int(t)),), f, linear) for t in ref] for f in flags]
        )  # points x 3 lengths x 2
        coef = np.einsum("ij,pjk->pik", inverse, measured)  # points x 3 powers x 2
        return _on_grid(coef, grid, slopes)

    poly_s, poly_b = coefficients(False)
    if ring > 1:
        linear_s, _ = coefficients(True)
        _, b1, b0 = poly_b.T
        # the longest length that fits each row alone (bytes are affine in t)
        top = np.maximum(np.where(b1 > 0, (cap - b0) / np.where(b1 > 0, b1, 1.0), 0.0), 0.0)
        gain = ((linear_s - poly_s) * np.stack([top**2, top, np.ones_like(top)], axis=1)).sum(1)
        use = gain >= 0
        poly_s = np.where(use[:, None], linear_s, poly_s)
    return poly_s, poly_b
