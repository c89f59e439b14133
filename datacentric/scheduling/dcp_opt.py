"""``dcp-opt``: ours. Per iteration, choose the group sizes and the assignment of
micro-batches to groups that minimise the iteration's makespan.

1. **Global batches.** The shared data order
   (:mod:`~datacentric.scheduling.global_batches`): every iteration sees the same
   mix of buckets, so none is left with only long samples.
2. **Micro-batches.** Each bucket's samples are packed (longest first, by tokens)
   into micro-batches of its cheapest configuration (SP size, micro-batch size and
   recomputation with the fewest GPU-seconds per sample, PAC included), capped so
   that no micro-batch exceeds ``1/item_split`` of the iteration's target makespan;
   a single text sample shorter than its bucket's representative recomputes what its
   own length needs (PAC's knapsack); the step's shortest text samples ride in the free
   memory of long ones where that is cheaper (:mod:`~datacentric.scheduling.riders`).
3. **Layout.** Group sizes (powers of two summing to the world) in proportion to the
   GPU-seconds that prefer each size.
4. **Assignment.** LPT on unrelated machines (each micro-batch may run on any size
   where it fits, at that size's time and recomputation; also tried with a target
   makespan, under which fillers go where they cost the fewest GPU-seconds), local
   search (moves and swaps off the makespan group, then moves to cheaper groups that
   free time for it), HiGHS on small iterations whose heuristic
   makespan is still above the lower bound (see ``docs/scheduling.md``), and a group's
   short micro-batches merged across buckets where that runs faster.
   A few layouts are tried (the proportional one and its neighbours), then a walk to
   better neighbouring layouts; the best wins.
5. **Phases.** On steps of at most :data:`NEIGHBOUR_LIMIT` micro-batches, also the
   step in two phases (:func:`two_phases`): the micro-batches whose cheapest size is
   above the smallest (or the largest present) first, then the rest, each phase
   solved as above; kept when its estimated makespan is at least :data:`PHASE_GAIN`
   shorter. Where every micro-batch prefers one size, the leftover ones of the last
   round in a phase of their own instead (:func:`tail_phase`). Where some take over
   half the step, those first, each on its own group, with fillers
   (:func:`filled_phase`), kept where shorter.
6. **Token-packed steps.** Also the step as megatron-dyncp forms it: samples of any
   bucket packed into CP groups up to a per-rank token cap, the rank layout re-formed
   for every micro-batch, under each (recomputation, cap) its search keeps
   (:class:`TokenPacked`); the fastest of all is the step.

Where each part lives: the layout and assignment of one step
(:func:`solve_iteration`) in :mod:`~datacentric.scheduling.layout_search`; the step in
phases (:func:`solve_step`) in :mod:`~datacentric.scheduling.step_phases`; the peers'
and token-packed steps (:class:`Portfolio`, :class:`TokenPacked`) in
:mod:`~datacentric.scheduling.portfolio`. Here: the policy's steps (:func:`stepwise`,
:func:`own_step`) and their micro-batches (:func:`make_items`); every name this module
held before is still importable from it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from datacentric.schedule import Iteration
from datacentric.scheduling.item import Item
from datacentric.scheduling.layout_search import (
    COST_ROUNDS,
    EXACT_IDLE,
    LAYOUT_ROUNDS,
    MERGE_SHARE,
    NEIGHBOUR_LIMIT,
    PEAK_TOL,
    SPLIT_GAP,
    SPLIT_ROUNDS,
    assign_on_layout,
    beats,
    best_layout,
    candidate_layouts,
    cheaper_past_node,
    idle_share,
    lower_bound,
    merge_small,
    neighbour_layouts,
    one_group_per_big_item,
    preference_views,
    preferred_class,
    refine_by_splitting,
    solve_iteration,
    straggles,
)
from datacentric.scheduling.measures import iteration_imbalance
from datacentric.scheduling.micro_batches import make_item, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput, PolicySteps
from datacentric.scheduling.portfolio import (
    PEER_GAIN,
    PEER_SAMPLES,
    PEERS,
    PORTFOLIO_SAMPLES,
    Portfolio,
    TokenPacked,
    peers_run,
    step_seconds,
)
from datacentric.scheduling.riders import with_riders
from datacentric.scheduling.search_steps import step_begun
from datacentric.scheduling.step_phases import (
    PHASE_GAIN,
    TAIL_GAIN,
    TAIL_ROUNDS,
    _in_phases,
    filled_phase,
    node_times,
    on_sizes,
    solve_step,
    tail_phase,
    two_phases,
)

#: every public name this module held before its parts moved (each the object of its home),
#: and the phases' runner, which a test patched here
__all__ = [
    "COST_ROUNDS",
    "EXACT_IDLE",
    "LAYOUT_PASSES",
    "LAYOUT_ROUNDS",
    "MERGE_SHARE",
    "NEIGHBOUR_LIMIT",
    "PEAK_TOL",
    "PEERS",
    "PEER_GAIN",
    "PEER_SAMPLES",
    "PHASE_GAIN",
    "PORTFOLIO_SAMPLES",
    "Portfolio",
    "RIDE_CHECK",
    "RIDE_STEP_SHARE",
    "SPLIT_GAP",
    "SPLIT_ROUNDS",
    "TAIL_GAIN",
    "TAIL_ROUNDS",
    "TOKEN_PACKED_SAMPLES",
    "TOKEN_PACKED_STEP_WORK",
    "TokenPacked",
    "UNPACK_IDLE",
    "UNPACK_PER_RANK",
    "_in_phases",
    "assign_on_layout",
    "beats",
    "best_layout",
    "candidate_layouts",
    "cheaper_past_node",
    "filled_phase",
    "idle_share",
    "lower_bound",
    "make_items",
    "merge_small",
    "neighbour_layouts",
    "node_times",
    "on_sizes",
    "one_group_per_big_item",
    "own_step",
    "peers_run",
    "preference_views",
    "preferred_class",
    "refine_by_splitting",
    "schedule",
    "solve_iteration",
    "solve_step",
    "step_seconds",
    "stepwise",
    "straggles",
    "tail_phase",
    "token_packed_runs",
    "two_phases",
]

#: dcp-opt's own search tries every step token-packed (:class:`TokenPacked`) on epochs of
#: at most this many samples ...
TOKEN_PACKED_SAMPLES = 50_000
#: ... and on larger ones (up to :data:`PORTFOLIO_SAMPLES`) where a step's samples times
#: the world is at most this: megatron-dyncp's forming places every sample on one of up
#: to ``world`` CP groups, and its search prices about ten (recomputation, cap)
#: candidates. 120,000 chat turns at 8 GPUs are 64,000 a step (0.9870 -> 0.9970 of the
#: bound with it); ``sft-longtail`` (100,000 samples) 14,000 at 8 GPUs (0.9746 -> 0.9800,
#: 5.7 -> 10.0 s of CPU), 57,000 at 16 (0.9773 -> 0.9782) and 228,000 at 32 (0.9752 ->
#: 0.9780, 3.5 -> 8.3 s: megatron-dyncp alone runs 0.9759 there since the loss head is
#: priced at 12 bytes a logit), but not 915,000 at 64 (7.3 -> 23.7 s, no step
#: token-packed). ``opensora-balanced`` at 32 GPUs (155,000) pays 4.5 -> 6.4 s for no
#: token-packed step.
TOKEN_PACKED_STEP_WORK = 250_000
#: Steps idle more than this share, whose packed micro-batches hold at most
#: :data:`UNPACK_PER_RANK` samples a rank, are also solved with those samples alone
#: (packed 8,192-token rows with 12% remainders at 8 GPUs: the remainders packed in pairs
#: and triples balanced 8 groups to within 0.9%, static's single ones to 0.4%).
UNPACK_IDLE = 0.002
UNPACK_PER_RANK = 8
#: Steps with riders (:mod:`~datacentric.scheduling.riders`) and at most this many
#: micro-batches a group are also solved without them; the shorter is kept.
RIDE_CHECK = 16
#: Riders are formed only where their estimated saving is at least this share of the
#: step's GPU-seconds (each bucket at its cheapest).
RIDE_STEP_SHARE = 0.002
#: Layouts of a step's micro-batches its search is told to try (:func:`solve_step`:
#: one layout, the two phases of two thresholds, a tail or filled phase; again with the
#: riders' check and where a few packed samples may run alone), for the progress of the
#: step now built (steps of the presets lay out 2 to 4 times their micro-batches, 7
#: with a second solve).
LAYOUT_PASSES = 4


def make_items(
    inp: PolicyInput, table: OptionTable, ids: np.ndarray, *, ride: bool = True
) -> list[Item]:
    """Pack a global batch's samples into micro-batches of their cheapest config, short
    samples riding in long ones' free memory where cheaper (unless not ``ride``)."""
    view, opts = inp.view, inp.options
    buckets = view.bucket_of[ids]
    present = np.unique(buckets)
    prefs = {int(b): table.preferred(int(b)) for b in present}
    counts = np.bincount(buckets, minlength=len(view.buckets))
    gpu_s = sum(prefs[b].gpu_seconds_per_sample * counts[b] for b in prefs)
    target = gpu_s / inp.world_size
    units = {}
    for b, cfg in prefs.items():
        units[b] = cfg.max_batch
        if opts.item_split > 0:
            units[b] = min(units[b], cfg.batch_for_time(target / opts.item_split))
    by_bucket = {b: ids[buckets == b] for b in prefs}
    if not ride:
        return [item for b, rest in by_bucket.items() for item in pack(table, b, rest, units[b])]
    return with_riders(
        table, by_bucket, lambda b, rest: pack(table, b, rest, units[b]), RIDE_STEP_SHARE * gpu_s
    )


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-opt`` policy: the whole epoch of :func:`stepwise`."""
    steps = stepwise(inp)
    iterations = list(steps.steps)
    return PolicyOutput(iterations=iterations, dropped=steps.dropped, settings=steps.settings)


def stepwise(inp: PolicyInput) -> PolicySteps:
    """The ``dcp-opt`` policy step by step: one iteration per global batch of the shared
    data order, each built from its own global batch only (after a search made once for
    the epoch), so the steps come in order as they are asked for; on epochs of at most
    :data:`PORTFOLIO_SAMPLES` samples, per step the best of its own and the steps
    ``static`` and ``dcp-pac`` would run (:class:`Portfolio`); where
    :func:`token_packed_runs`, its own search tries each step token-packed too
    (:class:`TokenPacked`)."""
    table = inp.single_sample_pac_table()
    chunks, dropped = inp.global_batches()
    out = PolicySteps(iter(()), dropped=list(dropped))
    out.steps = _steps(inp, table, chunks, out.settings)
    return out


def _steps(
    inp: PolicyInput, table: OptionTable, chunks: list[np.ndarray], settings: dict
) -> Iterator[Iteration]:
    """:func:`stepwise`'s iterations; ``settings`` gets the portfolio's counts at the end."""
    peers = Portfolio(inp) if len(inp.active) <= PORTFOLIO_SAMPLES else None
    packed = TokenPacked(inp) if token_packed_runs(inp, len(chunks)) else None
    inp.step_done(0, len(chunks))  # the epoch's steps, told before the first is out
    for k, chunk in enumerate(chunks):
        best = own_step(inp, table, chunk, k, packed)
        if peers is not None:
            best = peers.best(k, chunk, best)
        inp.step_done(k + 1, len(chunks))
        yield best
    if peers is not None:
        settings.update(peers.settings())
    if packed is not None:
        settings["token_packed_steps"] = packed.steps


def own_step(
    inp: PolicyInput,
    table: OptionTable,
    chunk: np.ndarray,
    k: int,
    packed: TokenPacked | None = None,
) -> Iteration:
    """Step ``k`` of the global batch ``chunk`` by dcp-opt's own search: its own
    micro-batches laid out by :func:`solve_step` and, with ``packed``, the token-packed
    steps of :class:`TokenPacked`; the fastest is kept."""
    items = make_items(inp, table, chunk)
    ride_check = any(item.mixed for item in items) and len(items) <= RIDE_CHECK * inp.world_size
    loose = [i for item in items if item.count > 1 for i in item.ids]
    unpack = 0 < len(loose) <= UNPACK_PER_RANK * inp.world_size
    step_begun(inp, LAYOUT_PASSES * len(items) * (1 + ride_check + unpack))
    best = solve_step(inp, table, items, k)
    if ride_check:
        # few micro-batches a group: riders' coarser grain may cost more than they save
        plain = solve_step(inp, table, make_items(inp, table, chunk, ride=False), k)
        best = min(best, plain, key=lambda it: step_seconds(inp, it))
    if unpack and iteration_imbalance(best, inp.world_size) > UNPACK_IDLE:
        # a few packed samples coarsen the balance: also the step with them alone
        alone = [item for item in items if item.count == 1]
        alone += [make_item(table, [i]) for i in loose]
        best = min(best, solve_step(inp, table, alone, k), key=lambda it: step_seconds(inp, it))
    return best if packed is None else packed.best(k, chunk, best)


def token_packed_runs(inp: PolicyInput, steps: int) -> bool:
    """Whether dcp-opt's own search tries the ``steps`` steps of this epoch token-packed
    (:data:`TOKEN_PACKED_SAMPLES`, :data:`TOKEN_PACKED_STEP_WORK`)."""
    samples = len(inp.active)
    if samples <= TOKEN_PACKED_SAMPLES:
        return True
    per_step = samples / max(steps, 1)
    return samples <= PORTFOLIO_SAMPLES and per_step * inp.world_size <= TOKEN_PACKED_STEP_WORK
