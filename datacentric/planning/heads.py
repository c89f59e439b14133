"""Which SP sizes a run may use: those its steps' groups can tile the world with, and
those its model's attention heads allow (pure: no torch).

A step's SP groups are powers of two dividing the world, or the whole world as one
group (:func:`mixable_sp_sizes`; the powers of two nest, so any mix of them tiles the
ranks aligned: :func:`nesting_sp_sizes`).

Ulysses sequence parallelism splits attention heads across the ranks of an SP group.
Query heads are split as they are, so the group size must divide ``num_heads``.
Key/value heads (grouped-query attention, ``num_kv_heads`` dividing ``num_heads``)
are repeated only as far as the group needs: each is repeated ``r`` times, the
smallest ``r`` with ``sp | num_kv_heads * r`` and ``num_kv_heads * r | num_heads``.
Such an ``r`` exists for every ``sp`` that divides ``num_heads`` (at worst
``r = num_heads / num_kv_heads``, one key/value head per query head), so the key/value
head count never narrows the choice: a model with 4 query and 2 key/value heads runs
at SP 1, 2 and 4.

The planner asks :func:`allowed_sp_sizes` (a model's whole choice on a world, both
rules applied: :func:`ulysses_sp_sizes`) and refuses a size no step may use
(:func:`check_step_sp_sizes`); the runtime checks with :func:`check_sp_sizes`, and a
schedule against the caps a model declares (``max_sp_size``, ``max_ring_size``: a model
whose loss needs whole samples, or whose attention runs Ulysses only) with
:func:`check_max_sp_size` and :func:`check_max_ring_size`; Ulysses repeats by
:func:`kv_head_repeat`. One rule, one place.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any


def _check_counts(num_heads: int, num_kv_heads: int) -> None:
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"{num_heads} query heads are not a multiple of {num_kv_heads} key/value heads"
        )


@functools.lru_cache(maxsize=1024)
def kv_head_repeat(num_heads: int, num_kv_heads: int, sp_size: int) -> int:
    """How many times Ulysses repeats each key/value head on a group of ``sp_size``:
    the smallest ``r`` with ``sp_size | num_kv_heads * r`` and
    ``num_kv_heads * r | num_heads`` (1: the heads travel as they are). Raises
    ``ValueError`` when ``sp_size`` does not divide ``num_heads``. Kept per head counts
    and size (the analytic model asks it for every pass it prices)."""
    _check_counts(num_heads, num_kv_heads)
    check_sp_sizes(num_heads, num_kv_heads, [sp_size])
    group = num_heads // num_kv_heads  # query heads per key/value head
    return next(
        r for r in range(1, group + 1) if group % r == 0 and (num_kv_heads * r) % sp_size == 0
    )


def allowed_sp_sizes(num_heads: int, num_kv_heads: int | None = None) -> list[int]:
    """Every SP size a model with these head counts can run, ascending: the divisors
    of ``num_heads`` (key/value heads are repeated as far as a group needs, see the
    module docstring). ``num_kv_heads`` defaults to ``num_heads``."""
    _check_counts(num_heads, num_kv_heads or num_heads)
    return [s for s in range(1, num_heads + 1) if num_heads % s == 0]


def nesting_sp_sizes(world_size: int, gpus_per_node: int, max_sp: int | None) -> list[int]:
    """SP sizes that can share one iteration: powers of two dividing the world (they
    nest, so any mix tiles the ranks aligned), capped at ``max_sp`` (default a node)."""
    cap = max_sp if max_sp is not None else max(1, gpus_per_node)
    sizes = [1]
    while world_size % (sizes[-1] * 2) == 0 and sizes[-1] * 2 <= min(cap, world_size):
        sizes.append(sizes[-1] * 2)
    return sizes


def mixable_sp_sizes(world_size: int) -> list[int]:
    """Every SP size a step may use at ``world_size``: the powers of two that divide
    it, plus the whole world (one group; at a world that is not a power of two, such
    as 3, 6 or 12, it is the only group of its phase)."""
    sizes = nesting_sp_sizes(world_size, world_size, world_size)
    if sizes[-1] != world_size:
        sizes.append(world_size)
    return sizes


def check_step_sp_sizes(world_size: int, sizes: Sequence[int]) -> None:
    """Raise ``ValueError`` naming the sizes of ``sizes`` no step may use at
    ``world_size`` (see :func:`mixable_sp_sizes`)."""
    allowed = mixable_sp_sizes(world_size)
    bad = sorted({int(s) for s in sizes if s not in allowed})
    if bad:
        raise ValueError(
            f"SP sizes {bad} cannot run at world size {world_size}: a step's SP groups are "
            f"powers of two dividing the world or the whole world ({allowed}; "
            "docs/scheduling.md)"
        )


def ulysses_sp_sizes(model: Any, world_size: int) -> list[int]:
    """The SP sizes the planner may use for ``model`` (any object with the model
    contract's ``num_heads``, and ``num_kv_heads`` and ``max_sp_size`` when it declares
    them) on ``world_size`` ranks: those a step may use (powers of two dividing the
    world, and the whole world; :func:`mixable_sp_sizes`) that its heads allow
    (:func:`allowed_sp_sizes`), none above its ``max_sp_size``."""
    heads = int(getattr(model, "num_heads", 0) or 0)
    kv_heads = int(getattr(model, "num_kv_heads", 0) or heads)
    allowed = set(allowed_sp_sizes(heads, kv_heads)) if heads else None
    cap = getattr(model, "max_sp_size", None) or world_size
    sizes = [s for s in mixable_sp_sizes(world_size) if s <= cap]
    return sizes if allowed is None else [s for s in sizes if s in allowed]


def check_sp_sizes(
    num_heads: int, num_kv_heads: int | None, sp_sizes: Iterable[int], what: str = "attention"
) -> None:
    """Raise ``ValueError`` naming the first SP size of ``sp_sizes`` that the head counts
    do not allow (see :func:`allowed_sp_sizes`); ``what`` names the heads' owner."""
    _check_counts(num_heads, num_kv_heads or num_heads)
    bad = sorted({int(s) for s in sp_sizes if s < 1 or num_heads % s})
    if bad:
        raise ValueError(
            f"the model has {num_heads} {what} heads, not divisible by SP size "
            f"{bad[0]}" + (f" (nor by {bad[1:]})" if len(bad) > 1 else "") + "; "
            "Ulysses sequence parallelism splits heads across the group: use SP sizes "
            f"that divide {num_heads} ({', '.join(map(str, allowed_sp_sizes(num_heads)))}), "
            "or a model whose head count they divide"
        )


def check_max_sp_size(model: object, sp_sizes: Iterable[int]) -> None:
    """Raise ``ValueError`` if an SP size of ``sp_sizes`` exceeds the model's
    ``max_sp_size`` (a model whose loss needs whole samples declares 1), naming why
    (its ``max_sp_size_reason``)."""
    found = _above_cap(model, "max_sp_size", sp_sizes)
    if found:
        cap, bad, why = found
        raise ValueError(
            f"{type(model).__name__} runs exactly only up to SP size {cap}, not {bad}: {why}"
        )


def check_max_ring_size(model: object, ring_sizes: Iterable[int]) -> None:
    """Raise ``ValueError`` if a ring degree of ``ring_sizes`` exceeds the model's
    ``max_ring_size`` (a model whose path runs Ulysses only declares 1), naming why (its
    ``max_ring_size_reason``)."""
    found = _above_cap(model, "max_ring_size", ring_sizes)
    if found:
        cap, bad, why = found
        raise ValueError(
            f"{type(model).__name__} runs rings of at most {cap} position"
            f"{'' if cap == 1 else 's'}, not {bad} (use Ulysses splits): {why}"
        )


def _above_cap(model: object, name: str, sizes: Iterable[int]) -> tuple[int, int, str] | None:
    """``(cap, smallest size above it, reason)`` for the model's declared ``name`` (and
    its ``name_reason``), or ``None`` when every size fits or it declares none."""
    cap = getattr(model, name, None)
    bad = sorted({int(s) for s in sizes if cap is not None and s > cap})
    if not bad:
        return None
    return int(cap), bad[0], str(getattr(model, f"{name}_reason", "the model declares it"))
