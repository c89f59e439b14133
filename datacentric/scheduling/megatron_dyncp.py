"""``megatron-dyncp``: a port of Megatron-Core's current dynamic context-parallel
scheduler (``DefaultDynamicCPScheduler``; see ``docs/scheduling.md`` for the files
and the commit followed).

Per global batch, micro-batches are formed one at a time across all ``N`` ranks:

- each sequence's CP size is the next power of two of ``L / C`` (``C``: the per-rank
  packed-token cap), and its work on ``c`` ranks is ``L**2 / c``; CP sizes stop at
  the largest power of two the model runs with some split within ``--max-sp``
  (default: the world): Ulysses dividing its heads, past them Ulysses x ring as
  Megatron's ``a2a+p2p`` CP runs (``--split-mode ulysses`` keeps the head count's
  limit, ``ring`` prices every group as one ring);
- sequences, longest first, join an existing group of exactly their size (or a
  larger power of two) or open a new group on the free ranks, whichever gives the
  least global maximum rank load, under the token cap ``C`` per rank and the work cap
  ``L_longest * C * 1.05``; what fits nowhere waits for the next micro-batch;
- free ranks left at the end are filled by doubling the first smallest group (only
  where the ranks are there: the fix for worlds that are not a power of two), else
  the micro-batch falls back to one group of every rank; groups must come out
  aligned (start divisible by size), which is asserted. At a world that is not a power
  of two (3, 6, 12 ranks) that one group of every rank is also where a sequence
  longer than the power-of-two groups hold runs (a micro-batch of its own).

Megatron re-forms the rank layout per micro-batch, and so does the port: each of its
micro-batches is one phase of the step (:class:`~datacentric.schedule.Iteration`),
whose CP groups each run their packed sequences (split in halves while they do not
fit the memory cap). A step whose groups the model cannot run at their size (an SP
size that does not divide its heads) falls back to one layout: the units are placed
as every fixed-size policy places them, each on a group of the smallest runnable size
at least its own; so does a step whose micro-batch cannot cover the ranks with those
sizes.

Tuned as ``static`` is: the cap ``C`` and the recomputation (none, every block, or
the plan's per-bucket choice) are searched (:func:`search`), each candidate priced on
a spread of the epoch's steps, the best few on every step; ``settings`` reports the
choice. ``SchedulingConfig.megatron_tokens_per_rank`` fixes the cap (the recomputation
is still searched).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from datacentric.planning.bucket_options import mixable_sp_sizes, split_candidates
from datacentric.planning.proved_price import has_floor
from datacentric.schedule import Iteration
from datacentric.scheduling.measures import epoch_estimate_s, step_bound_s
from datacentric.scheduling.micro_batches import emit_iteration
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.packed import fitting_items
from datacentric.scheduling.placement import place_at_sizes
from datacentric.scheduling.policy_input import (
    PolicyInput,
    PolicyOutput,
    StepMaker,
    any_recompute,
    full_recompute,
    no_recompute,
)
from datacentric.scheduling.search_steps import priced_steps, searched

#: Megatron's workload slack.
DELTA = 0.05

#: The recomputation settings searched, by the name ``settings`` reports.
RECOMPUTATIONS = {"none": no_recompute, "full": full_recompute, "plan": any_recompute}

#: Candidates re-priced on every step after the first pass.
FINALISTS = 3


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
) -> tuple[list[CPGroup], list[tuple[int, int]]]:
    """One micro-batch over ``ranks`` ranks from ``rem`` (``(id, length)``, longest
    first), in CP groups of at most ``max_cp`` ranks (default: ``ranks``); returns its
    groups (in rank order) and the sequences left for later. ``whole``: one group of
    every rank may run too (past ``max_cp``, at a world that is not a power of two):
    the micro-batch of a sequence longer than ``max_cp`` groups hold, and the
    fallback where the groups cannot cover the ranks."""
    top_cp = min(ranks, max_cp or ranks)
    seed_id, seed_len = rem[0]
    c = cp_min(seed_len, cap)
    if c > top_cp:
        if whole and seed_len <= cap * ranks:
            return full_group(rem, cap, ranks)
        raise ValueError(
            f"megatron-dyncp: a sequence of {seed_len} tokens needs CP {c} at "
            f"{cap} tokens per rank but CP groups hold at most {ranks if whole else top_cp} "
            "ranks here (the model's heads, --max-sp and the world); raise "
            "megatron_tokens_per_rank"
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
) -> list[list[CPGroup]]:
    """Megatron's schedule of one global batch: its micro-batches, each a list of CP
    groups (at most ``max_cp`` ranks, or one of every rank if ``whole``: see
    :func:`form_micro_batch`) covering the ranks."""
    rem = sorted(lengths, key=lambda x: -x[1])  # stable: ties keep their order
    out = []
    while rem:
        groups, rem = form_micro_batch(rem, cap, ranks, max_cp, whole)
        out.append(groups)
    return out


def cp_sizes(inp: PolicyInput) -> list[int]:
    """The CP sizes Megatron's groups may take here: powers of two dividing the world,
    and the whole world (one group of every rank), up to ``--max-sp`` (default: the
    world), that the model runs with some split
    (:func:`~datacentric.planning.bucket_options.split_candidates`: past the head count
    on a ring, as Megatron's ``a2a+p2p`` context parallelism runs)."""
    top = inp.options.max_sp_size or inp.world_size
    sizes = [s for s in mixable_sp_sizes(inp.world_size) if s <= top]
    return [s for s in sizes if split_candidates(inp.cost_model, s)] or [1]


def cp_limits(inp: PolicyInput) -> tuple[int, bool]:
    """The largest power-of-two CP size of :func:`cp_sizes` and whether one group of
    every rank runs beyond it (a world that is not a power of two, such as 6)."""
    sizes = cp_sizes(inp)
    nested = [s for s in sizes if s & (s - 1) == 0]
    return nested[-1], sizes[-1] != nested[-1]


def default_tokens_per_rank(inp: PolicyInput, table: OptionTable) -> int:
    """Megatron's default cap: the most tokens per rank that fit every bucket on some
    SP size within a node under ``table``'s recomputation."""
    return max(1, min(rank_tokens(inp, table, b) for b in inp.active_buckets()))


def rank_tokens(inp: PolicyInput, table: OptionTable, b: int) -> int:
    """The most tokens of bucket ``b`` one rank holds on an SP size within a node (on
    its smallest size where nothing fits within)."""
    rep = inp.view.rep_tokens(b)
    per_rank = [
        cfg.max_batch * rep // s
        for s in table.node_sizes
        if (cfg := table.config(b, s)) is not None
    ]
    return max(per_rank) if per_rank else rep // table.min_sp(b)


def cap_candidates(inp: PolicyInput, table: OptionTable) -> list[int]:
    """Per-rank caps searched: the default, and powers of two from 4,096 tokens up to
    the most tokens any bucket fits on one rank (or on its smallest SP size)."""
    if inp.options.megatron_tokens_per_rank:
        return [int(inp.options.megatron_tokens_per_rank)]
    top = max(rank_tokens(inp, table, b) for b in inp.active_buckets())
    caps = {default_tokens_per_rank(inp, table)}
    c = 4096
    while c < top:
        caps.add(c)
        c *= 2
    caps.add(top)
    return sorted(caps)


def build_steps(
    inp: PolicyInput,
    table: OptionTable,
    cap: int,
    chunks: list[np.ndarray],
    first: int = 0,
    formed: dict[tuple[int, int], list[list[CPGroup]] | None] | None = None,
    told: Callable[[int], None] | None = None,
    built: dict[int, Iteration] | None = None,
) -> list[Iteration]:
    """The iterations of ``chunks`` (steps ``first``, ``first + 1``, ...) under ``cap``.
    ``formed``: Megatron's micro-batches per (step, cap), kept across calls (they do not
    depend on the recomputation, so a search forms them once per cap). ``told(k)``:
    step ``k`` is built. ``built``: steps built already under the same table and cap,
    by step (taken from it, not built again)."""
    formed = {} if formed is None else formed
    built = {} if built is None else built
    out = []
    for k, chunk in enumerate(chunks, start=first):
        out.append(built.pop(k) if k in built else build_step(inp, table, cap, k, chunk, formed))
        if told is not None:
            told(k)
    return out


def build_step(
    inp: PolicyInput,
    table: OptionTable,
    cap: int,
    k: int,
    chunk: np.ndarray,
    formed: dict[tuple[int, int], list[list[CPGroup]] | None],
) -> Iteration:
    """Step ``k`` (its samples ``chunk``) under ``cap``: Megatron's micro-batches (formed
    once per (step, cap) into ``formed``), else one layout (:func:`one_layout`)."""
    world = inp.world_size
    lengths = list(zip(chunk.tolist(), inp.view.tokens[chunk].tolist()))
    if (k, cap) not in formed:
        max_cp, whole = cp_limits(inp)
        try:
            formed[k, cap] = megatron_micro_batches(lengths, cap, world, max_cp, whole)
        except NoLayoutError:
            formed[k, cap] = None
    phases = formed[k, cap]
    if phases is not None:
        groups, placed = [], []
        for phase, micro_batch in enumerate(phases):
            for g in micro_batch:
                groups.append((g.size, fitting_items(table, g.ids, g.size)))
                placed.append((g.first, phase))
        runnable = all(
            table.config(item.bucket, sp) is not None for sp, items in groups for item in items
        )
        if runnable:
            return emit_iteration(k, world, groups, table, placed=placed)
    return one_layout(inp, table, k, lengths, cap, cp_sizes(inp))


def one_layout(
    inp: PolicyInput,
    table: OptionTable,
    k: int,
    lengths: list[tuple[int, int]],
    cap: int,
    runnable: list[int],
) -> Iteration:
    """Step ``k`` on one layout: each sequence packed as Megatron would at its CP size
    (the smallest of ``runnable`` holding it, else the largest), each unit on the
    smallest size at least that where it runs, placed as ``dcp-inter`` places its
    micro-batches."""
    world = inp.world_size
    max_cp = runnable[-1]
    by_size: dict[int, list[int]] = {}
    for sid, length in sorted(lengths, key=lambda x: -x[1]):
        c = cp_min(length, cap)
        by_size.setdefault(next((s for s in runnable if s >= c), max_cp), []).append(sid)
    items, own = [], []
    for c, ids in sorted(by_size.items()):
        per_group = max(1, int(cap * c))
        batch: list[int] = []
        tokens = 0
        for sid in [*ids, None]:
            length = 0 if sid is None else int(inp.view.tokens[sid])
            if batch and (sid is None or tokens + length > per_group):
                for item in fitting_items(table, batch, c):
                    sizes = [
                        s for s in runnable if s >= c and np.isfinite(table.item_time(item, s))
                    ]
                    sizes = sizes or [s for s in runnable if np.isfinite(table.item_time(item, s))]
                    if not sizes:
                        bucket = inp.view.buckets[item.bucket].name
                        raise ValueError(
                            f"megatron-dyncp: step {k}: a micro-batch of bucket {bucket!r} "
                            f"fits no SP size up to {max_cp}"
                        )
                    items.append(item)
                    own.append(sizes[0])
                batch, tokens = [], 0
            if sid is not None:
                batch.append(sid)
                tokens += length
    groups = place_at_sizes(items, own, table, world, inp.options.local_search_moves)
    return emit_iteration(k, world, groups, table)


def search(inp: PolicyInput) -> tuple[str, OptionTable, int, list[Iteration]]:
    """The (recomputation, its table, per-rank cap) with the least estimated time, and
    its steps: every candidate priced on a spread of the epoch's steps, the best
    :data:`FINALISTS` on every step (the steps the first pass built taken as they are);
    its progress told in steps priced (:class:`Told`)."""
    chunks, _ = inp.global_batches()
    formed: dict[tuple[int, int], list[list[CPGroup]] | None] = {}
    built: dict[tuple[str, int, int], Iteration] = {}
    told = Told(inp)
    chosen = finalists(inp, formed, built, told=told)
    told.finalists([(name, cap) for name, _, cap in chosen], formed, built)
    best: tuple[float, str, int, list[Iteration]] | None = None
    for n, (name, table, cap) in enumerate(chosen):
        own = {k: it for (was, c, k), it in built.items() if (was, c) == (name, cap)}
        try:
            steps = build_steps(inp, table, cap, chunks, 0, formed, told.built(n), own)
            total = epoch_estimate_s(steps, inp.cost_model, inp.view.shapes, inp.world_size)
        except ValueError:
            told.build_stopped(n)
            continue
        if best is None or total < best[0] * (1 - 1e-9):
            best = (total, name, cap, steps)
    if best is None:
        raise ValueError("megatron-dyncp: no searched setting schedules every step")
    name = best[1]
    table = inp.table(name if name != "plan" else "pac", RECOMPUTATIONS[name])
    return name, table, best[2], best[3]


def settings_searched(inp: PolicyInput) -> list[tuple[str, OptionTable, list[int]]]:
    """The recomputation settings whose table fits every bucket, each with its table and
    its caps (:func:`cap_candidates`), in the order :func:`finalists` prices them."""
    out = []
    for name, allowed in RECOMPUTATIONS.items():
        table = inp.table(name if name != "plan" else "pac", allowed)
        if all(table.options(b) for b in inp.active_buckets()):
            out.append((name, table, cap_candidates(inp, table)))
    return out


class Told:
    """``megatron-dyncp``'s search told in steps priced (:func:`~.search_steps.searched`):
    each candidate's few steps of the first pass, then each finalist's every step. A step
    whose micro-batches are formed counts two (forming them costs about as much as laying
    them out), one formed before (by another recomputation at the same cap, or counted
    to be) one.

    The total counts every candidate on all its steps and learns as the search goes: the
    steps a candidate no longer needs (it fails, or costs more than the third best so
    far) leave it, and so do the candidates not started of a setting whose proved bounds
    (:meth:`bounds`) exceed the third best total so far (while fewer are priced, the
    worst of them: the third best can only be lower once three are); the finalists'
    builds are counted as they stand once they are known."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        chunks, _ = inp.global_batches()
        self.steps, self.sample = len(chunks), priced_steps(len(chunks))
        self.pending = {
            (name, cap): [True] * len(self.sample)
            for name, _, caps in settings_searched(inp)
            for cap in caps
        }
        """Per (recomputation, cap) candidate, in the search's order, whether each of
        its first-pass steps is still to be priced."""
        self.formed: set[tuple[int, int]] = set()
        """The (step, cap) whose micro-batches are formed."""
        self.started: set[tuple[str, int]] = set()
        self.floors: dict[str, float] = {}
        """Per setting, the sum of its priced steps' proved bounds."""
        self.totals: list[float] = []
        """The first pass's totals of the candidates that may be finalists."""
        self.done = 0.0
        self.builds = [
            [0.0 if k in self.sample else 2.0 for k in range(self.steps)] for _ in range(FINALISTS)
        ]
        """Per finalist, the units of its epoch's steps not built yet (those its first pass
        built are taken as they are)."""
        self.tell()

    def first_left(self) -> float:
        """The units of the first pass's steps still to be priced, the candidates of a
        setting whose bounds exceed the third best so far (:class:`Told`) left out."""
        totals = sorted(self.totals)
        worst = totals[min(FINALISTS, len(totals)) - 1] if totals else np.inf
        seen, left = set(self.formed), 0.0
        for (name, cap), pending in self.pending.items():
            if (name, cap) not in self.started and self.floors.get(name, 0.0) > worst:
                continue
            for k, to_price in zip(self.sample, pending):
                if to_price:
                    left += 1.0 if (k, cap) in seen else 2.0
                    seen.add((k, cap))
        return left

    def tell(self) -> None:
        left = self.first_left() + sum(map(sum, self.builds))
        searched(self.inp, self.done, self.done + left)

    def bounds(self, floors: dict[str, float]) -> None:
        """The sum of each setting's proved step bounds on the priced steps."""
        self.floors = floors
        self.tell()

    def priced(self, name: str, cap: int, j: int) -> None:
        """Candidate (``name``, ``cap``) priced its ``j``-th step of the first pass."""
        self.started.add((name, cap))
        key = (self.sample[j], cap)
        self.done += 1.0 if key in self.formed else 2.0
        self.formed.add(key)
        self.pending[name, cap][j] = False
        self.tell()

    def stopped(self, name: str, cap: int, j: int, total: float | None = None) -> None:
        """Candidate (``name``, ``cap``) stopped after ``j`` steps (``total``: its total
        when it may be a finalist): the rest of its steps are dropped."""
        self.started.add((name, cap))
        pending = self.pending[name, cap]
        pending[j:] = [False] * (len(pending) - j)
        if total is not None:
            self.totals.append(total)
        self.tell()

    def finalists(
        self,
        chosen: list[tuple[str, int]],
        formed: dict[tuple[int, int], object],
        built: dict[tuple[str, int, int], object],
    ) -> None:
        """The finalists are known (their (recomputation, cap), in order; ``formed``: the
        steps whose micro-batches are formed; ``built``: the steps built, by
        (recomputation, cap, step), taken as they are): their builds counted as they are."""
        seen, self.builds = set(formed), []
        for name, cap in chosen:
            units = [1.0 if (k, cap) in seen else 2.0 for k in range(self.steps)]
            self.builds.append([0.0 if (name, cap, k) in built else u for k, u in enumerate(units)])
            seen.update((k, cap) for k in range(self.steps))
        self.tell()

    def built(self, n: int) -> Callable[[int], None]:
        """Told the steps the ``n``-th finalist builds."""

        def step(k: int) -> None:
            self.done += self.builds[n][k]
            self.builds[n][k] = 0.0
            self.tell()

        return step

    def build_stopped(self, n: int) -> None:
        """The ``n``-th finalist's build failed: its rest is dropped."""
        self.builds[n] = [0.0] * self.steps
        self.tell()


def finalists(
    inp: PolicyInput,
    formed: dict[tuple[int, int], list[list[CPGroup]] | None],
    built: dict[tuple[str, int, int], Iteration] | None = None,
    told: Told | None = None,
) -> list[tuple[str, OptionTable, int]]:
    """The best :data:`FINALISTS` (recomputation, its table, per-rank cap) priced on a
    spread of the epoch's steps (``formed``: the micro-batches formed on the way;
    ``built``: the steps built, by (recomputation, cap, step); ``told``: hears each step
    priced and each dropped); ``ValueError`` when no candidate runs. A candidate stops
    being priced once its steps so far and the proved bounds of the rest
    (:func:`step_floors_s`) exceed the third best's total: it cannot be a finalist."""
    chunks, _ = inp.global_batches()
    sample = priced_steps(len(chunks))
    built = {} if built is None else built
    first: list[tuple[float, str, int]] = []
    why = "no recomputation setting fits every bucket"
    settings = settings_searched(inp)
    bounds = {name: step_floors_s(inp, name, [chunks[k] for k in sample]) for name, *_ in settings}
    if told is not None:
        told.bounds({name: sum(floors) for name, floors in bounds.items()})
    for name, table, caps in settings:
        floors = bounds[name]
        rest = np.cumsum(floors[::-1])[::-1].tolist()[1:] + [0.0]  # bounds of later steps
        for cap in caps:
            worst = sorted(first)[FINALISTS - 1][0] if len(first) >= FINALISTS else np.inf
            if sum(floors) > worst:
                break  # no cap of this setting can be a finalist: its steps cost more
            total, priced, later = 0.0, 0, 0.0
            try:
                for k, later in zip(sample, rest):
                    it = build_steps(inp, table, cap, [chunks[k]], k, formed)[0]
                    built[name, cap, k] = it
                    total += it.est_makespan_s
                    if told is not None:
                        told.priced(name, cap, priced)
                    priced += 1
                    if total + later > worst:
                        break
            except ValueError as err:  # a sequence needs more ranks, or a unit fits nothing
                why = f"{cap} tokens per rank, recomputation {name}: {err}"
                if told is not None:
                    told.stopped(name, cap, priced)
                continue
            kept = total + later <= worst
            if told is not None:
                told.stopped(name, cap, priced, total if kept else None)
            if kept:
                first.append((total, name, cap))
    if not first:
        raise ValueError(f"megatron-dyncp: no searched cap and recomputation runs ({why})")
    first.sort()
    return [
        (name, inp.table(name if name != "plan" else "pac", RECOMPUTATIONS[name]), cap)
        for _, name, cap in first[:FINALISTS]
    ]


def step_makers(inp: PolicyInput) -> list[StepMaker]:
    """The steps ``megatron-dyncp``'s finalists would run, one maker each (``dcp-opt``'s
    own search tries every one on every step); ``ValueError`` when none runs."""
    out = []
    formed: dict[tuple[int, int], list[list[CPGroup]] | None] = {}  # shared by the finalists
    built: dict[tuple[str, int, int], Iteration] = {}  # the steps the search priced
    chosen = finalists(inp, formed, built)
    for name, table, cap in chosen:

        def make(k: int, chunk: np.ndarray, name=name, table=table, cap=cap) -> Iteration:
            for key in [key for key in formed if key[0] < k]:
                del formed[key]  # steps are asked for in order: earlier ones are done
            if (name, cap, k) in built:
                return built.pop((name, cap, k))
            return build_steps(inp, table, cap, [chunk], k, formed)[0]

        out.append(make)
    return out


def step_floors_s(inp: PolicyInput, recompute: str, chunks: list[np.ndarray]) -> list[float]:
    """Per step of ``chunks``, a lower bound on its makespan under a recomputation
    setting (``none``, ``full``, ``plan``: any), whatever the cap: its proved step bound
    (:func:`~datacentric.scheduling.measures.step_bound_s`); 0 for a cost model without
    the floor it needs."""
    if not has_floor(inp.cost_model):
        return [0.0] * len(chunks)
    table, rc = inp.pac_table(), (recompute if recompute in ("none", "full") else None)
    return [step_bound_s(table, c, inp.world_size, recompute=rc) for c in chunks]


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``megatron-dyncp`` policy."""
    name, _, cap, iterations = search(inp)
    _, dropped = inp.global_batches()
    settings = {"tokens_per_rank": cap, "recompute": name, "max_cp_size": cp_sizes(inp)[-1]}
    return PolicyOutput(iterations=iterations, dropped=dropped, settings=settings)
