"""``megatron-dyncp``: a port of Megatron-Core's current dynamic context-parallel
scheduler (``DefaultDynamicCPScheduler``; see ``docs/scheduling.md`` for the files
and the commit followed).

Per global batch, micro-batches are formed one at a time across all ``N`` ranks:

- each sequence's CP size is the next power of two of ``L / C`` (``C``: the per-rank
  packed-token cap, ``ScheduleOptions.megatron_tokens_per_rank``, by default the
  most tokens per rank that fit every bucket with full recomputation), and its work
  on ``c`` ranks is ``L**2 / c``;
- sequences, longest first, join an existing group of exactly their size (or a
  larger power of two) or open a new group on the free ranks, whichever gives the
  least global maximum rank load, under the token cap ``C`` per rank and the work cap
  ``L_longest * C * 1.05``; what fits nowhere waits for the next micro-batch;
- free ranks left at the end are filled by doubling the first smallest group (only
  where the ranks are there: the fix for worlds that are not a power of two), else
  the micro-batch falls back to one group of every rank; groups must come out
  aligned (start divisible by size), which is asserted.

Megatron re-forms the rank layout per micro-batch, and so does the port: each of its
micro-batches is one phase of the step (:class:`~datacentric.schedule.Iteration`),
whose CP groups each run their packed sequences (split in halves while they do not
fit the memory cap). A step whose groups the model cannot run at their size (an SP
size that does not divide its heads) falls back to one layout: the units are placed
as every fixed-size policy places them, each on a group of the smallest runnable size
at least its own. Every block recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datacentric.scheduling.micro_batches import emit_iteration
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.packed import fitting_items
from datacentric.scheduling.placement import place_at_sizes
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput

#: Megatron's workload slack.
DELTA = 0.05


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
    rem: list[tuple[int, int]], cap: int, ranks: int
) -> tuple[list[CPGroup], list[tuple[int, int]]]:
    """One micro-batch over ``ranks`` ranks from ``rem`` (``(id, length)``, longest
    first); returns its groups (in rank order) and the sequences left for later."""
    seed_id, seed_len = rem[0]
    c = cp_min(seed_len, cap)
    if c > ranks:
        raise ValueError(
            f"megatron-dyncp: a sequence of {seed_len} tokens needs CP {c} at "
            f"{cap} tokens per rank but there are only {ranks} ranks; raise "
            "megatron_tokens_per_rank"
        )
    work_cap = seed_len * cap * (1 + DELTA)
    groups = [CPGroup(0, c)]
    groups[0].add(seed_id, seed_len, seed_len / c)
    top = groups[0].load
    free = c
    left: list[tuple[int, int]] = []
    for sid, length in rem[1:]:
        best: tuple[float, CPGroup | None, int] | None = None
        c = cp_min(length, cap)
        while c <= ranks:
            w = length * length / c
            for g in groups:
                if g.size != c or g.tokens + length / c > cap:
                    continue
                score = max(top, g.load + w)
                if score <= work_cap and (best is None or score < best[0]):
                    best = (score, g, c)
            if ranks - free >= c:
                score = max(top, w)
                if score <= work_cap and (best is None or score < best[0]):
                    best = (score, None, c)
            c *= 2
        if best is None:
            left.append((sid, length))
            continue
        _, g, c = best
        if g is None:
            g = CPGroup(free, c)
            groups.append(g)
            free += c
        g.add(sid, length, length / c)
        top = max(top, g.load)
    while free < ranks:
        if not expand_once(groups, ranks, ranks - free):
            return full_group(rem, cap, ranks)
        free = sum(g.size for g in groups)
    for g in groups:
        assert g.first % g.size == 0, f"megatron-dyncp: CP group of {g.size} at rank {g.first}"
    return groups, left


def expand_once(groups: list[CPGroup], ranks: int, empty: int) -> bool:
    """Double the first smallest group (shifting later groups right), if the empty
    ranks allow it."""
    s = min(g.size for g in groups)
    target = min(2 * s, ranks)
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
    lengths: list[tuple[int, int]], cap: int, ranks: int
) -> list[list[CPGroup]]:
    """Megatron's schedule of one global batch: its micro-batches, each a list of CP
    groups covering the ranks."""
    rem = sorted(lengths, key=lambda x: -x[1])  # stable: ties keep their order
    out = []
    while rem:
        groups, rem = form_micro_batch(rem, cap, ranks)
        out.append(groups)
    return out


def tokens_per_rank(inp: PolicyInput, table: OptionTable) -> int:
    """The per-rank token cap: every bucket fits this many tokens per rank on some
    SP size within a node."""
    if inp.options.megatron_tokens_per_rank:
        return int(inp.options.megatron_tokens_per_rank)
    limits = []
    for b in inp.active_buckets():
        rep = inp.view.rep_tokens(b)
        per_rank = [
            cfg.max_batch * rep // s
            for s in table.node_sizes
            if (cfg := table.config(b, s)) is not None
        ]
        limits.append(max(per_rank) if per_rank else rep // table.min_sp(b))
    return max(1, min(limits))


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``megatron-dyncp`` policy."""
    world = inp.world_size
    table = inp.full_table()
    cap = tokens_per_rank(inp, table)
    chunks, dropped = inp.global_batches()
    out = PolicyOutput(iterations=[], dropped=dropped)
    for k, chunk in enumerate(chunks):
        lengths = [(int(i), int(inp.view.tokens[i])) for i in chunk]
        phases = megatron_micro_batches(lengths, cap, world)
        groups, placed = [], []
        for phase, micro_batch in enumerate(phases):
            for g in micro_batch:
                groups.append((g.size, fitting_items(table, g.ids, g.size)))
                placed.append((g.first, phase))
        if all(table.config(item.bucket, sp) is not None for sp, items in groups for item in items):
            out.iterations.append(emit_iteration(k, world, groups, table, placed=placed))
            continue
        items, own = [], []
        for micro_batch in phases:
            for g in micro_batch:
                size = max(g.size, min(s for s in table.all_sizes if s >= g.size))
                made = fitting_items(table, g.ids, size)
                items += made
                own += [size] * len(made)
        one_layout = place_at_sizes(items, own, table, world, inp.options.local_search_moves)
        out.iterations.append(emit_iteration(k, world, one_layout, table))
    return out
