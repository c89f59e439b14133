"""``megatron-dyncp``: a port of Megatron-Core's current dynamic context-parallel
scheduler (``DefaultDynamicCPScheduler``; see ``docs/scheduling.md`` for the files
and the commit followed).

Per global batch, micro-batches are formed one at a time across all ``N`` ranks:

- each sequence's CP size is the next power of two of ``L / C`` (``C``: the per-rank
  packed-token cap), and its work on ``c`` ranks is ``L**2 / c``; CP sizes stop at
  the largest power of two the model runs with some split within ``--max-sp-size``
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

Where each part lives: Megatron's forming of a global batch into micro-batches of CP
groups (:func:`megatron_micro_batches`) in :mod:`~datacentric.scheduling.megatron_groups`;
a step under one cap and recomputation (:func:`build_steps`, :func:`one_layout`) in
:mod:`~datacentric.scheduling.megatron_steps`. Here: the caps and recomputations
searched, the search and its progress (:class:`Told`), the finalists' step makers and
the policy; every name this module held before is still importable from it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datacentric.planning.proved_price import has_floor
from datacentric.schedule import Iteration
from datacentric.scheduling.measures import epoch_estimate_s, step_bound_s
from datacentric.scheduling.megatron_groups import (
    DELTA,
    CPGroup,
    NoLayoutError,
    best_place,
    cp_min,
    expand_once,
    form_micro_batch,
    full_group,
    megatron_micro_batches,
)
from datacentric.scheduling.megatron_steps import (
    build_step,
    build_steps,
    cp_limits,
    cp_sizes,
    one_layout,
)
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import (
    PolicyInput,
    PolicyOutput,
    StepMaker,
    any_recompute,
    full_recompute,
    no_recompute,
)
from datacentric.scheduling.search_steps import priced_steps, searched

#: every name this module held before its parts moved (each the object of its home)
__all__ = [
    "CPGroup",
    "DELTA",
    "FINALISTS",
    "NoLayoutError",
    "RECOMPUTATIONS",
    "Told",
    "best_place",
    "build_step",
    "build_steps",
    "cap_candidates",
    "cp_limits",
    "cp_min",
    "cp_sizes",
    "default_tokens_per_rank",
    "expand_once",
    "finalists",
    "form_micro_batch",
    "full_group",
    "megatron_micro_batches",
    "one_layout",
    "rank_tokens",
    "schedule",
    "search",
    "settings_searched",
    "step_floors_s",
    "step_makers",
]


#: The recomputation settings searched, by the name ``settings`` reports.
RECOMPUTATIONS = {"none": no_recompute, "full": full_recompute, "plan": any_recompute}


#: Candidates re-priced on every step after the first pass.
FINALISTS = 3


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
