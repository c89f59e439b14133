"""Megatron-Core's forming of one global batch into micro-batches of CP groups, as
``megatron-dyncp`` (:mod:`~datacentric.scheduling.megatron_dyncp`) ports it.

Sequences, longest first, join a group of their CP size (the next power of two of
``L / C``, ``C`` the per-rank token cap) or a larger one, or open a new group on the
free ranks, whichever gives the least global maximum rank load (:func:`best_place`),
under the token cap and the work cap ``L_longest * C * (1 + DELTA)``; free ranks left
at the end are filled by doubling the first smallest group (:func:`expand_once`), else
the micro-batch is one group of every rank (:func:`full_group`).
:func:`megatron_micro_batches` forms a global batch's micro-batches one at a time
(:func:`form_micro_batch`), each a list of :class:`CPGroup` covering the ranks.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from datacentric.progress import counted
from datacentric.scheduling.global_batches import GroupCap

#: Megatron's workload slack.
DELTA = 0.05


class NoLayoutError(ValueError):
    """Megatron's forming cannot cover the ranks with the CP sizes the model runs."""


@dataclass
class CPGroup:
    """One CP group of a micro-batch: contiguous ranks and the sequences it holds."""

    first: int
    size: int
    ids: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    tokens: float = 0.0
    squares: float = 0.0
    """Sum of ``L**2`` over :attr:`lengths` (kept by :meth:`add`)."""

    def add(self, sid: int, length: int, tokens: float) -> None:
        """Hold sequence ``sid`` of ``length`` tokens, ``tokens`` of them per rank."""
        self.ids.append(sid)
        self.lengths.append(length)
        self.tokens += tokens
        self.squares += float(length) * length

    @property
    def load(self) -> float:
        return self.squares / self.size


def cp_min(length: int, cap: int, min_cp: int = 1) -> int:
    """The smallest CP size ``min_cp * 2**k`` holding ``length`` at ``cap`` per rank."""
    c = max(1, min_cp)
    while c * cap < length:
        c *= 2
    return c


def form_micro_batch(
    rem: list[tuple[int, int]],
    cap: int,
    ranks: int,
    max_cp: int | None = None,
    whole: bool = False,
    limit: GroupCap | None = None,
) -> tuple[list[CPGroup], list[tuple[int, int]]]:
    """One micro-batch over ``ranks`` ranks from ``rem`` (``(id, length)``, longest
    first), in CP groups of at most ``max_cp`` ranks (default: ``ranks``); returns its
    groups (in rank order) and the sequences left for later. ``whole``: one group of
    every rank may run too (past ``max_cp``, at a world that is not a power of two):
    the micro-batch of a sequence longer than ``max_cp`` groups hold, and the
    fallback where the groups cannot cover the ranks. ``limit``: where ``max_cp`` comes
    from, as the refusal of a sequence too long for it says (default: the model)."""
    top_cp = min(ranks, max_cp or ranks)
    seed_id, seed_len = rem[0]
    c = cp_min(seed_len, cap)
    if c > top_cp:
        if whole and seed_len <= cap * ranks:
            return full_group(rem, cap, ranks)
        held = ranks if whole else top_cp
        limit = limit or GroupCap(held, False)
        wider = ", or a larger --max-sp-size" if limit.set_by_user else ""
        raise ValueError(
            f"megatron-dyncp: a sequence of {seed_len} tokens needs CP {c} at "
            f"{cap} tokens per rank but CP groups hold at most {counted(held, 'rank')} here "
            f"({limit.source}); raise megatron_tokens_per_rank{wider}"
        )
    work_cap = seed_len * cap * (1 + DELTA)
    groups = [CPGroup(0, c)]
    groups[0].add(seed_id, seed_len, seed_len / c)
    top = groups[0].load
    free = c
    left: list[tuple[int, int]] = []
    by_size = {c: [groups[0]]}  # per CP size, its groups that may still take a sequence
    shortest = rem[-1][1]
    room = float("inf")  # once every rank is grouped: a bound on what still fits
    i = 1
    while i < len(rem):
        sid, length = rem[i]
        if length > room:  # no group holds it, nor any longer one: skip them at once
            # (rem is longest first, so -length ascends)
            j = bisect.bisect_left(rem, -room, lo=i, key=lambda x: -x[1])
            left.extend(rem[i:j])
            i = j
            continue
        i += 1
        best = best_place(length, cap, by_size, top, work_cap, top_cp, ranks - free)
        if best is None:
            left.append((sid, length))
            if free == ranks:  # rooms only shrink: any bound above the widest will do
                room = max((cap - h.tokens) * h.size for h in groups) * (1 + 1e-9) + 1
            continue
        _, g, c = best
        if g is None:
            g = CPGroup(free, c)
            groups.append(g)
            by_size.setdefault(c, []).append(g)
            free += c
        g.add(sid, length, length / c)
        top = max(top, g.load)
        if g.tokens + shortest / c > cap:  # it holds none of the rest any more
            by_size[c].remove(g)
    while free < ranks:
        if not expand_once(groups, ranks, ranks - free, top_cp):
            if top_cp < ranks and not whole:
                raise NoLayoutError(f"megatron-dyncp: {ranks - free} ranks left empty")
            return full_group(rem, cap, ranks)
        free = sum(g.size for g in groups)
    for g in groups:
        assert g.first % g.size == 0, f"megatron-dyncp: CP group of {g.size} at rank {g.first}"
    return groups, left


def best_place(
    length: int,
    cap: int,
    by_size: dict[int, list[CPGroup]],
    top: float,
    work_cap: float,
    top_cp: int,
    empty: int,
) -> tuple[float, CPGroup | None, int] | None:
    """Where a sequence of ``length`` tokens goes: ``(score, group, CP size)`` with the
    least score (the micro-batch's top load after it), a group of ``by_size`` or a new
    one (``None``) on ``empty`` ranks, under the token cap and ``work_cap``; the first
    found on ties (CP sizes ascending, a size's groups in order, then a new group).
    No score is below ``top``, so the first place scoring ``top`` wins at once."""
    best: tuple[float, CPGroup | None, int] | None = None
    c = cp_min(length, cap)
    while c <= top_cp:
        w = length * length / c
        for g in by_size.get(c, ()):
            if g.tokens + length / c > cap:
                continue
            score = max(top, g.squares / c + w)  # g.load, inlined: the hot loop
            if score <= work_cap and (best is None or score < best[0]):
                best = (score, g, c)
                if score <= top:
                    return best
        if empty >= c:
            score = max(top, w)
            if score <= work_cap and (best is None or score < best[0]):
                best = (score, None, c)
                if score <= top:
                    return best
        c *= 2
    return best


def expand_once(groups: list[CPGroup], ranks: int, empty: int, max_cp: int | None = None) -> bool:
    """Double the first smallest group (shifting later groups right), if the empty
    ranks and ``max_cp`` allow it."""
    s = min(g.size for g in groups)
    target = min(2 * s, ranks)
    if target > (max_cp or ranks):
        return False
    need = target - s
    for k, g in enumerate(groups):
        if g.size != s or need > empty or g.first + s - 1 + need >= ranks:
            continue
        g.size = target
        for later in groups[k + 1 :]:
            later.first += need
        return True
    return False


def full_group(
    rem: list[tuple[int, int]], cap: int, ranks: int
) -> tuple[list[CPGroup], list[tuple[int, int]]]:
    """The fallback: one group of every rank, filled first-fit under the token cap."""
    g = CPGroup(0, ranks)
    left = []
    for sid, length in rem:
        if g.tokens + length / ranks <= cap:
            g.add(sid, length, length / ranks)
        else:
            left.append((sid, length))
    if not g.ids:
        raise ValueError(
            "megatron-dyncp: nothing fits one micro-batch; raise megatron_tokens_per_rank"
        )
    return [g], left


def megatron_micro_batches(
    lengths: list[tuple[int, int]],
    cap: int,
    ranks: int,
    max_cp: int | None = None,
    whole: bool = False,
    limit: GroupCap | None = None,
) -> list[list[CPGroup]]:
    """Megatron's schedule of one global batch: its micro-batches, each a list of CP
    groups (at most ``max_cp`` ranks, or one of every rank if ``whole``: see
    :func:`form_micro_batch`; ``limit``: where ``max_cp`` comes from) covering the ranks."""
    rem = sorted(lengths, key=lambda x: -x[1])  # stable: ties keep their order
    out = []
    while rem:
        groups, rem = form_micro_batch(rem, cap, ranks, max_cp, whole, limit)
        out.append(groups)
    return out
