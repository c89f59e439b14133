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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from datacentric.schedule import Iteration
from datacentric.scheduling import (
    balance,
    dcp_pac,
    exact,
    megatron_dyncp,
    peer_bounds,
    static,
)
from datacentric.scheduling.item import Item
from datacentric.scheduling.measures import (
    estimated_grad_sync_s,
    iteration_imbalance,
    overlaps_grad_sync,
)
from datacentric.scheduling.micro_batches import (
    emit_iteration,
    make_item,
    pack,
    place_groups,
    split_item,
)
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import assign_to_layout, ensure_items, time_matrix
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput, PolicySteps, StepMaker
from datacentric.scheduling.riders import with_riders
from datacentric.scheduling.search_steps import laid_out, set_aside, solved, step_begun
from datacentric.settings.scheduling import SchedulingConfig

#: Epochs of at most this many samples also try every step as the peers run it.
PORTFOLIO_SAMPLES = 200_000
#: The policies whose steps dcp-opt's portfolio tries (:class:`Portfolio`): each name's
#: step makers, one per configuration its search keeps for the epoch. (megatron-dyncp's
#: steps are in dcp-opt's own search, :class:`TokenPacked`.)
PEERS: dict[str, Callable[[PolicyInput], list[StepMaker]]] = {
    "static": static.step_makers,
    # the paper's policy: on 1,023 documents of 91K tokens and one of 131K at 64 GPUs
    # (4M-token steps) its per-micro-batch knapsack ran 0.928 of the bound, dcp-opt 0.876
    "dcp-pac": dcp_pac.step_makers,
}
#: The most samples an epoch may have for a peer's search to run in the portfolio (up to
#: :data:`PORTFOLIO_SAMPLES`).
PEER_SAMPLES = {"static": PORTFOLIO_SAMPLES, "dcp-pac": PORTFOLIO_SAMPLES}
#: A peer's step replaces dcp-opt's when this much shorter (relative).
PEER_GAIN = 1e-9
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
#: Iterations with at most this many micro-batches also try the neighbouring layouts.
NEIGHBOUR_LIMIT = 4000
#: ... and walk from the best layout to better neighbours in at most this many steps.
LAYOUT_ROUNDS = 8
#: Loads this close (seconds) count as equal.
PEAK_TOL = 1e-9
#: Split micro-batches when the makespan is this far above the lower bound ...
SPLIT_GAP = 0.01
#: ... in at most this many rounds.
SPLIT_ROUNDS = 4
#: Rounds of moving filler items to cheaper sizes, then balancing again.
COST_ROUNDS = 3
#: Micro-batches up to this share of their group's load are tried for merging.
MERGE_SHARE = 0.1
#: HiGHS is tried only on iterations whose heuristic assignment idles more than this.
EXACT_IDLE = 0.02
#: A step runs in two phases only when that is estimated this much shorter.
PHASE_GAIN = 0.01
#: A tail phase (:func:`tail_phase`) is tried on steps of at most this many micro-batches
#: a group ...
TAIL_ROUNDS = 8
#: ... and kept when estimated this much shorter (relative; Megatron re-forms its layout
#: for every micro-batch, and a peer's step is taken at any gain).
TAIL_GAIN = 1e-9
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


def lower_bound(times: np.ndarray, sizes: list[int], world_size: int) -> float:
    """No makespan is below the cheapest GPU-seconds over the world, nor below the
    fastest any single micro-batch can run."""
    gpu = (times * np.asarray(sizes)).min(axis=1).sum() / world_size
    return float(max(gpu, times.min(axis=1).max()))


def straggles(times: np.ndarray, sizes: list[int], world_size: int) -> bool:
    """Whether one micro-batch, at its fastest on ``sizes``, outlasts the step's
    GPU-seconds bound (every micro-batch at its cheapest over the world): a larger
    group (a ring past the head count, or a group across nodes) may shorten the step."""
    fastest = times.min(axis=1)
    if not np.isfinite(fastest).all():
        return False
    gpu = (times * np.asarray(sizes)).min(axis=1).sum() / world_size
    return bool(fastest.max() > gpu)


def cheaper_past_node(table: OptionTable, buckets: set[int], sp: int) -> bool:
    """Whether some bucket of ``buckets`` costs fewer GPU-seconds per sample on ``sp``
    ranks (past a node) than at its preferred size within one (llama-7b's 164K-token
    documents: 71.8 GPU-s on 16 H200s without recomputation, 77.3 on 8 recomputing half
    the blocks)."""
    for b in buckets:
        cfg = table.config(b, sp)
        if cfg is not None and cfg.gpu_seconds_per_sample < (
            table.preferred(b).gpu_seconds_per_sample * (1 - 1e-9)
        ):
            return True
    return False


def preferred_class(times: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Each item's cheapest size class (fewest GPU-seconds; the smaller on ties)."""
    return np.argmin(times * np.asarray(sizes, dtype=float), axis=1)


def candidate_layouts(
    world_size: int, sizes: list[int], times: np.ndarray, n_items: int, neighbours: bool
) -> list[list[int]]:
    """The rounded and apportioned layouts, the rounded one with one more group of each
    size and, if ``neighbours``, the rounded one's :func:`neighbour_layouts`."""
    pref = preferred_class(times, sizes)
    own = times[np.arange(len(times)), pref]
    load = np.bincount(pref, weights=own * np.asarray(sizes)[pref], minlength=len(sizes))
    longest = np.zeros(len(sizes))
    np.maximum.at(longest, pref, own)
    count = np.bincount(pref, minlength=len(sizes))
    apportioned = balance.proportional_layout(world_size, sizes, load, n_items, longest, count)
    base = balance.rounded_layout(world_size, sizes, times)
    out = [base, apportioned, one_group_per_big_item(base, sizes, times, world_size)]
    for k in range(len(sizes)):  # one more group of a size
        out.append(balance.rounded_layout(world_size, sizes, times, bump=k))
    if neighbours:
        out += neighbour_layouts(base, sizes)
    unique = {tuple(sorted(lay)): None for lay in out if len(lay) <= n_items}
    return [list(lay) for lay in unique]


def one_group_per_big_item(
    layout: list[int], sizes: list[int], times: np.ndarray, world_size: int
) -> list[int]:
    """``layout`` with at least one group per item longer than half the step's bound on
    its cheapest size (two such items on one group already exceed the bound; a layout
    rounded from loads alone can have fewer groups of a size than such items), the
    GPUs taken from groups of the smallest size. ``layout`` itself if that is too few."""
    pref = preferred_class(times, sizes)
    own = times[np.arange(len(times)), pref]
    half = lower_bound(times, sizes, world_size) / 2
    need = np.bincount(pref[own > half], minlength=len(sizes))
    out = list(layout)
    for k, size in enumerate(sizes):
        extra = int(need[k]) - out.count(size)
        if k == 0 or extra <= 0:
            continue
        ranks = extra * size
        if out.count(sizes[0]) * sizes[0] - ranks < sizes[0]:
            return list(layout)
        for _ in range(ranks // sizes[0]):
            out.remove(sizes[0])
        out += [size] * extra
    return out


def neighbour_layouts(layout: list[int], sizes: list[int]) -> list[list[int]]:
    """The layouts one step from ``layout``: one group split into groups of the next
    smaller size, or groups of a size merged into one of the next larger."""
    out = []
    for small, big in zip(sizes, sizes[1:]):
        if big % small:
            continue
        if layout.count(big):  # split one big group into small ones
            alt = list(layout)
            alt.remove(big)
            out.append(alt + [small] * (big // small))
        if layout.count(small) >= big // small:  # merge small groups into a big one
            alt = list(layout)
            for _ in range(big // small):
                alt.remove(small)
            out.append(alt + [big])
    return out


def solve_iteration(
    inp: PolicyInput, table: OptionTable, items: list[Item], node_times: np.ndarray | None = None
) -> list[tuple[int, list[Item]]]:
    """Group sizes and assignment of ``items`` with the least estimated makespan
    (``node_times``: their :func:`node_times`, when made already)."""
    world, opts = inp.world_size, inp.options
    items = ensure_items(items, 1, table)
    laying = len(items)
    sizes = list(table.node_sizes)
    if node_times is not None and len(node_times) == len(items):
        times = node_times
    else:
        times = time_matrix(table, items, sizes)
    top = opts.max_sp_size or world
    buckets = {it.bucket for it in items}
    fits = bool(np.isfinite(times).any(axis=1).all())
    slow: bool | None = None  # straggles(times, sizes, world), asked once per matrix
    for s in table.all_sizes:  # past a node only for micro-batches that fit nothing within,
        # or (up to --max-sp-size) where the plan offers them a ring and one alone outlasts
        # the step's GPU-seconds bound, or where a bucket runs on fewer GPU-seconds
        if s <= sizes[-1]:
            continue
        if fits and s <= top and slow is None:
            slow = straggles(times, sizes, world)
        if (
            not fits
            or (s <= top and slow and table.has_rings(buckets, s))
            or (s <= top and cheaper_past_node(table, buckets, s))
        ):
            sizes.append(s)
            times = np.column_stack([times, time_matrix(table, items, [s])])
            fits, slow = bool(np.isfinite(times).any(axis=1).all()), None
    if not np.isfinite(times).any(axis=1).all():
        j = int(np.flatnonzero(~np.isfinite(times).any(axis=1))[0])
        raise ValueError(
            f"a micro-batch of bucket {table.view.buckets[items[j].bucket].name!r} fits no "
            "SP size at this world size"
        )
    neighbours = len(items) <= NEIGHBOUR_LIMIT
    best: tuple[tuple[float, int], list[int], np.ndarray] | None = None
    for prefer in preference_views(times, sizes, world):
        found = best_layout(prefer, times, sizes, world, len(items), neighbours, opts)
        if found is not None and (best is None or beats(found[0], best[0])):
            best = found
    if best is None:
        # Too few micro-batches for any layout tried: fall back to merging groups.
        laid_out(inp, laying)
        return assign_to_layout(items, [1] * world, table, world, max_moves=opts.local_search_moves)
    (span, _), layout, owner = best
    group_class = np.asarray([sizes.index(s) for s in layout])
    bound = lower_bound(times, sizes, world)
    if span > (1 + SPLIT_GAP) * bound:
        items, times, owner = refine_by_splitting(
            table, items, times, sizes, group_class, owner, bound, opts.local_search_moves
        )
        span = balance.makespan(times, group_class, owner)
    if (
        opts.exact_solver
        and exact.available()
        and idle_share(times, group_class, sizes, owner, world) > EXACT_IDLE
        and len(items) * len(layout) <= opts.exact_max_binaries
    ):
        began = time.process_time()
        better = exact.solve_assignment(times, group_class, owner, max_nodes=opts.exact_max_nodes)
        solved(inp, time.process_time() - began)
        if better is not None:
            owner = better
    t_own = times[np.arange(len(items)), group_class[owner]]
    groups = []
    for g, s in enumerate(layout):
        members = np.flatnonzero(owner == g)
        group = [items[j] for j in members]
        if neighbours:
            group = merge_small(table, group, t_own[members].tolist(), s)
        groups.append((s, group))
    laid_out(inp, laying)
    return groups


def merge_small(table: OptionTable, items: list[Item], times: list[float], sp: int) -> list[Item]:
    """Merge a group's short micro-batches (``times``: each one's time on ``sp`` ranks)
    into mixed ones where the merged pass fits the cap and runs faster than the two apart
    (each pass pays fixed costs; micro-batches are packed per bucket, so a step's few
    samples of each image bucket make many short ones). Shortest first, each into the
    running merge; the group's load only drops."""
    if len(items) < 2:
        return items
    load = sum(times)
    order = sorted(range(len(items)), key=lambda j: times[j])
    out: list[Item] = []
    current, t_current = items[order[0]], times[order[0]]
    for j in order[1:]:
        if times[j] <= MERGE_SHARE * load:
            merged = make_item(table, [*current.ids, *items[j].ids])
            t_merged = table.item_time(merged, sp)
            if t_merged < t_current + times[j] - PEAK_TOL:
                current, t_current = merged, t_merged
                continue
        out.append(current)
        current, t_current = items[j], times[j]
    out.append(current)
    return out


def preference_views(times: np.ndarray, sizes: list[int], world: int) -> list[np.ndarray]:
    """The time matrices that decide where items prefer to run (and so the layouts):
    ``times`` itself and, when some item's cheapest size alone takes longer than the
    step's GPU-second bound (a long video on one GPU), the same with those slow sizes
    struck out for it, so that it prefers the cheapest size that fits in the bound."""
    bound = lower_bound(times, sizes, world)
    slow = times > bound * (1 + PEAK_TOL)
    slow &= ~slow.all(axis=1, keepdims=True)  # items slow everywhere keep every size
    pref = preferred_class(times, sizes)
    if not slow[np.arange(len(times)), pref].any():
        return [times]
    return [times, np.where(slow, np.inf, times)]


def best_layout(
    prefer: np.ndarray,
    times: np.ndarray,
    sizes: list[int],
    world: int,
    n_items: int,
    neighbours: bool,
    opts: SchedulingConfig,
) -> tuple[tuple[float, int], list[int], np.ndarray] | None:
    """The best layout and assignment found when items prefer sizes by ``prefer``
    (``times`` with some sizes struck out): the candidate layouts, then a walk to
    better neighbouring layouts. ``(score, layout, owner)``, or None if none fits."""
    pref = preferred_class(prefer, sizes)
    strict = np.full_like(times, np.inf)
    strict[np.arange(n_items), pref] = times[np.arange(n_items), pref]
    best: tuple[tuple[float, int], list[int], np.ndarray] | None = None
    seen: set[tuple[int, ...]] = set()

    def consider(layouts: list[list[int]]) -> bool:
        """Assign on each new layout; keep the best by makespan, then by fewer groups at
        the makespan (a step towards a shorter one). True if one improved on it."""
        nonlocal best
        improved = False
        for layout in layouts:
            layout = balance.merge_groups(world, layout, n_items)
            key = tuple(sorted(layout))
            if key in seen or any(s not in sizes for s in layout):
                continue
            seen.add(key)
            found = assign_on_layout(
                times, strict, pref, sizes, layout, opts.local_search_moves, thorough=neighbours
            )
            if found is not None and (best is None or beats(found[0], best[0])):
                best = (found[0], layout, found[1])
                improved = True
        return improved

    consider(candidate_layouts(world, sizes, prefer, n_items, neighbours))
    # Local improvement over layouts: walk to the best neighbouring layout while the
    # score drops (the candidates above are only one step from the rounded one).
    for _ in range(LAYOUT_ROUNDS if neighbours else 0):
        if best is None or not consider(neighbour_layouts(best[1], sizes)):
            break
    return best


def assign_on_layout(
    times: np.ndarray,
    strict: np.ndarray,
    pref: np.ndarray,
    sizes: list[int],
    layout: list[int],
    max_moves: int,
    *,
    thorough: bool = True,
) -> tuple[tuple[float, int], np.ndarray] | None:
    """LPT (each item on its cheapest size when the layout has it, else anywhere), local
    search and every group filled; ``((makespan, groups at it), owner)``, or None.
    ``thorough`` (steps of at most :data:`NEIGHBOUR_LIMIT` micro-batches) also tries LPT
    towards target makespans and rounds of GPU-second cuts, and keeps the best."""
    group_class = np.asarray([sizes.index(s) for s in layout])
    classes = np.unique(group_class)
    start = np.where(np.isin(pref, classes)[:, None], strict, times)
    if not np.isfinite(start[:, classes]).any(axis=1).all():
        return None
    best: tuple[tuple[float, int], np.ndarray] | None = None
    bound = lower_bound(times, sizes, sum(layout))
    targets = (None, bound, 1.02 * bound, 1.05 * bound) if thorough else (None,)
    for target in targets:
        owner, _ = balance.lpt(start, group_class, sizes, target=target)
        owner = balance.local_search(times, group_class, sizes, owner, max_moves)
        for _ in range(COST_ROUNDS if thorough else 0):
            span = balance.makespan(times, group_class, owner)
            trial = balance.cut_gpu_seconds(times, group_class, sizes, owner)
            trial = balance.local_search(times, group_class, sizes, trial, max_moves)
            if balance.makespan(times, group_class, trial) >= span - PEAK_TOL:
                break
            owner = trial
        if not balance.fill_empty(times, group_class, owner):
            continue
        t_own = times[np.arange(len(owner)), group_class[owner]]
        loads = np.bincount(owner, weights=t_own, minlength=len(layout))
        span = float(loads.max())
        score = (span, int((loads >= span - PEAK_TOL).sum()))
        if best is None or beats(score, best[0]):
            best = (score, owner)
    return best


def beats(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """Whether score ``a`` (makespan, groups at it) beats ``b``."""
    if abs(a[0] - b[0]) > PEAK_TOL:
        return a[0] < b[0]
    return a[1] < b[1]


def idle_share(
    times: np.ndarray, group_class: np.ndarray, sizes: list[int], owner: np.ndarray, world: int
) -> float:
    """Idle share of the world's time under an assignment (by the estimates)."""
    t_own = times[np.arange(len(owner)), group_class[owner]]
    loads = np.bincount(owner, weights=t_own, minlength=len(group_class))
    busy = float((loads * np.asarray(sizes)[group_class]).sum())
    span = float(loads.max())
    return 1.0 - busy / (world * span) if span > 0 else 0.0


def refine_by_splitting(
    table: OptionTable,
    items: list[Item],
    times: np.ndarray,
    sizes: list[int],
    group_class: np.ndarray,
    owner: np.ndarray,
    bound: float,
    max_moves: int,
) -> tuple[list[Item], np.ndarray, np.ndarray]:
    """Finer grain where it pays: when micro-batches are all of similar size, loads
    come in whole items and some groups run one item longer. Halve the largest
    multi-sample item of every group above the bound, and search again (a few rounds,
    kept only while the makespan drops)."""
    span = balance.makespan(times, group_class, owner)
    for _ in range(SPLIT_ROUNDS):
        t_own = times[np.arange(len(owner)), group_class[owner]]
        loads = np.bincount(owner, weights=t_own, minlength=len(group_class))
        new_items, new_owner, replaced = [], [], []
        for g in np.flatnonzero(loads > (1 + SPLIT_GAP / 2) * bound).tolist():
            members = [j for j in np.flatnonzero(owner == g).tolist() if items[j].count > 1]
            if members:
                j = max(members, key=lambda j: (t_own[j], -j))
                first, second = split_item(items[j], table)
                replaced.append((j, first))
                new_items.append(second)
                new_owner.append(g)
        if not replaced:
            break
        trial = list(items)
        for j, first in replaced:
            trial[j] = first
        trial += new_items
        changed = [j for j, _ in replaced] + list(range(len(items), len(trial)))
        trial_times = np.vstack([times, np.zeros((len(new_items), times.shape[1]))])
        trial_times[changed] = time_matrix(table, [trial[j] for j in changed], sizes)
        trial_owner = np.r_[owner, np.asarray(new_owner, dtype=owner.dtype)]
        trial_owner = balance.local_search(trial_times, group_class, sizes, trial_owner, max_moves)
        trial_span = balance.makespan(trial_times, group_class, trial_owner)
        if trial_span >= span - 1e-12:
            break
        items, times, owner, span = trial, trial_times, trial_owner, trial_span
    return items, times, owner


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


class TokenPacked:
    """Token-packed steps as options of dcp-opt's own search: each global batch formed
    as megatron-dyncp forms it (sequences packed up to a per-rank token cap into CP
    groups, the rank layout re-formed for every micro-batch), under each (recomputation,
    cap) its search keeps for the epoch
    (:func:`~datacentric.scheduling.megatron_dyncp.step_makers`: made once, on the
    first step where a token-packed step could beat dcp-opt's own, by
    :func:`~datacentric.scheduling.peer_bounds.step_floors`). Short documents that
    each fill a fraction of a rank pay a pass's fixed costs once per micro-batch that
    way (120,000 chat turns of about 180 tokens at 8 GPUs: 1.1% shorter than dcp-opt's
    bucket-packed micro-batches). Every step megatron-dyncp runs is then in dcp-opt's
    own search, so its portfolio need not run it (:data:`PEERS`)."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        self.makers: list[StepMaker] | None = None
        self.steps = 0

    def best(self, k: int, chunk: np.ndarray, own: Iteration) -> Iteration:
        """The fastest of ``own`` and the token-packed steps ``k`` of ``chunk``."""
        inp = self.inp
        best, seconds = own, step_seconds(inp, own)
        floors = peer_bounds.step_floors(inp, "megatron-dyncp", [chunk])
        if not peer_bounds.could_win(floors, [seconds], PEER_GAIN):
            return own
        if self.makers is None:
            began = time.process_time()
            try:
                self.makers = megatron_dyncp.step_makers(inp)
            except ValueError:  # no cap and recomputation forms every sampled step
                self.makers = []
            set_aside(inp, time.process_time() - began)  # made once: no step's pace
        for make in self.makers:
            try:
                it = make(k, chunk)
            except ValueError:  # this cap cannot run this step
                continue
            if step_seconds(inp, it) < seconds * (1 - PEER_GAIN):
                best, seconds = it, step_seconds(inp, it)
        self.steps += best is not own
        return best


def step_seconds(inp: PolicyInput, it: Iteration) -> float:
    """Step ``it``'s estimated makespan plus its exposed gradient sync (as the epoch
    estimate and :class:`Portfolio` count it)."""
    cost, world = inp.cost_model, inp.world_size
    reduction = float(cost.grad_sync_time_s(world))
    sync = estimated_grad_sync_s(
        it, cost, inp.view.shapes, reduction, overlaps_grad_sync(cost, world)
    )
    return it.est_makespan_s + sync


def solve_step(inp: PolicyInput, table: OptionTable, items: list[Item], k: int) -> Iteration:
    """Step ``k`` of ``items``: on one layout, in :func:`two_phases` where that is at
    least :data:`PHASE_GAIN` shorter, else with a :func:`tail_phase` where shorter."""
    node = node_times(table, items)  # read by each layout tried, made once
    best = emit_iteration(k, inp.world_size, solve_iteration(inp, table, items, node), table)
    phased = two_phases(inp, table, items, k, node)
    if phased is not None and phased.est_makespan_s < best.est_makespan_s * (1 - PHASE_GAIN):
        best = phased
    tail = tail_phase(inp, table, items, k, node) if phased is None else None
    if tail is not None and tail.est_makespan_s < best.est_makespan_s * (1 - TAIL_GAIN):
        best = tail
    filled = filled_phase(inp, table, items, k, node)
    if filled is not None and filled.est_makespan_s < best.est_makespan_s * (1 - TAIL_GAIN):
        best = filled
    return best


class Portfolio:
    """Per step, the fastest (estimated makespan plus exposed gradient sync) of dcp-opt's
    own step and the steps of every finalist configuration of each peer of :data:`PEERS`
    on the same global batch: every configuration a peer may choose is in dcp-opt's
    search space, and the one a peer picks for its epoch is among its finalists, so
    dcp-opt is never behind a peer on any step. A peer's search (its finalists, made
    once for the epoch) runs on the first step where its floor could beat the step held
    (:mod:`~datacentric.scheduling.peer_bounds`); a peer ruled out on every step is
    reported in ``peers_skipped``, one over its :data:`PEER_SAMPLES` in ``peers_dropped``.
    Each step depends only on its own global batch and the epoch's searches."""

    def __init__(self, inp: PolicyInput) -> None:
        self.inp = inp
        self.reduction = float(inp.cost_model.grad_sync_time_s(inp.world_size))
        self.overlap = overlaps_grad_sync(inp.cost_model, inp.world_size)
        self.names = peers_run(inp)
        self.makers: dict[str, list[StepMaker]] = {}
        self.counts = {name: 0 for name in PEERS}

    def total(self, it: Iteration) -> float:
        """Step ``it``'s makespan plus its exposed gradient sync."""
        inp = self.inp
        sync = estimated_grad_sync_s(
            it, inp.cost_model, inp.view.shapes, self.reduction, self.overlap
        )
        return it.est_makespan_s + sync

    def best(self, k: int, chunk: np.ndarray, own: Iteration) -> Iteration:
        """The fastest of ``own`` and the peers' steps ``k`` of ``chunk``."""
        best, seconds, who = own, self.total(own), "dcp-opt"
        for name in self.names:
            floors = peer_bounds.step_floors(self.inp, name, [chunk])
            if not peer_bounds.could_win(floors, [seconds], PEER_GAIN):
                continue
            for make in self._makers(name):
                try:
                    it = make(k, chunk)
                except ValueError:  # this configuration cannot run this step
                    continue
                if self.total(it) < seconds * (1 - PEER_GAIN):
                    best, seconds, who = it, self.total(it), name
        if who != "dcp-opt":
            self.counts[who] += 1
        return best

    def _makers(self, name: str) -> list[StepMaker]:
        if name not in self.makers:
            began = time.process_time()
            try:
                self.makers[name] = PEERS[name](self.inp)
            except ValueError:  # the peer cannot run this epoch at all
                self.makers[name] = []
            set_aside(self.inp, time.process_time() - began)  # made once: no step's pace
        return self.makers[name]

    def settings(self) -> dict:
        """How many steps each peer gave, the peers skipped and those dropped."""
        return {
            "steps_from_peers": dict(self.counts),
            "peers_skipped": [name for name in self.names if name not in self.makers],
            "peers_dropped": [name for name in PEERS if name not in self.names],
        }


def peers_run(inp: PolicyInput) -> list[str]:
    """The peers of :data:`PEERS` whose search the portfolio may run on this epoch (those
    whose :data:`PEER_SAMPLES` allows its size), in order."""
    return [name for name in PEERS if len(inp.active) <= PEER_SAMPLES[name]]


def node_times(table: OptionTable, items: list[Item]) -> np.ndarray:
    """``items``' :func:`~datacentric.scheduling.placement.time_matrix` on the sizes
    within a node (``table.node_sizes``), as :func:`solve_iteration`, :func:`two_phases`,
    :func:`tail_phase` and :func:`filled_phase` read it."""
    return time_matrix(table, items, list(table.node_sizes))


def on_sizes(
    table: OptionTable, items: list[Item], sizes: list[int], node: np.ndarray | None
) -> np.ndarray:
    """``items``' time matrix on ``sizes``: the columns of the sizes within a node from
    ``node`` (their :func:`node_times`) where given, the others made here (each column
    is its size's alone)."""
    within = list(table.node_sizes)
    if node is None:
        return time_matrix(table, items, sizes)
    past = [s for s in sizes if s not in within]
    more = time_matrix(table, items, past)
    columns = [node[:, within.index(s)] if s in within else more[:, past.index(s)] for s in sizes]
    return np.column_stack(columns) if columns else np.zeros((len(items), 0))


def two_phases(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases, or None where it does not apply: first the micro-batches
    whose cheapest size is at least a threshold, then the rest, each phase laid out and
    assigned by :func:`solve_iteration`; the shorter of two thresholds is kept:

    - the second smallest cheapest size present (above one GPU when some micro-batch
      prefers one: a long video on two GPUs);
    - the largest (a 1M-token document on 128 GPUs while the rest wait), solved without
      the exact solver (on longctx-1m at 256 GPUs its node-limited search took 0.17 s per
      phase and gained 0.5% of the epoch).

    One layout keeps groups of the large size open for the whole step, running short
    micro-batches at their cost there; two phases let the short ones run on the small
    sizes after the long ones. Tried on steps of at most :data:`NEIGHBOUR_LIMIT`
    micro-batches. ``node``: the micro-batches' :func:`node_times`, when made already."""
    if len(items) > NEIGHBOUR_LIMIT:
        return None
    sizes = list(table.node_sizes)
    pref = preferred_class(on_sizes(table, items, sizes, node), sizes)
    present = sorted(set(pref.tolist()))
    if len(present) < 2:
        return None
    best: Iteration | None = None
    for threshold, exact_solver in ((present[1], True), (present[-1], False)):
        if not exact_solver and threshold == present[1]:
            continue  # the same split as the first
        large, small = np.flatnonzero(pref >= threshold), np.flatnonzero(pref < threshold)
        phased = _in_phases(inp, table, items, (large, small), k, node, exact_solver)
        if phased is not None and (best is None or phased.est_makespan_s < best.est_makespan_s):
            best = phased
    return best


def tail_phase(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases when every micro-batch prefers one size and a few of
    them are left over once each group of that size holds as many (25 documents of
    164K tokens on four groups of 16 ranks): the longest whole rounds first, the
    remainder after them, solved on its own (the whole world for one document, as
    Megatron's last micro-batch runs it). None where that does not apply: more than
    :data:`TAIL_ROUNDS` micro-batches a group, or no remainder. ``node``: the
    micro-batches' :func:`node_times`, when made already."""
    if len(items) > TAIL_ROUNDS * inp.world_size:
        return None
    top = inp.options.max_sp_size or inp.world_size
    sizes = [s for s in table.all_sizes if s <= top]
    times = on_sizes(table, items, sizes, node)
    gpu = times * np.asarray(sizes, dtype=float)
    if not np.isfinite(gpu).any(axis=1).all():
        return None
    pref = np.argmin(gpu, axis=1)
    if len(set(pref.tolist())) != 1:
        return None
    groups = inp.world_size // sizes[int(pref[0])]
    rest = len(items) % groups if groups > 1 else 0
    if rest == 0 or len(items) > TAIL_ROUNDS * groups:
        return None
    order = np.argsort(-times[np.arange(len(items)), pref], kind="stable").tolist()
    cut = len(items) - rest
    return _in_phases(inp, table, items, (order[:cut], order[cut:]), k, node)


def filled_phase(
    inp: PolicyInput, table: OptionTable, items: list[Item], k: int, node: np.ndarray | None = None
) -> Iteration | None:
    """Step ``k`` in two phases where some micro-batches take more than half the step's
    bound on their cheapest size within a node (a 432K-token clip on 2 H100s: 6.13 s of
    a 12.1 s step; with 13 of them one layout puts two on a pair of GPUs): first the
    longest of them, each on a group of its cheapest size, as many as the world holds
    at once, with the longest other micro-batches filling the ranks left for as long;
    then the rest, each phase solved by :func:`solve_iteration`. None where no
    micro-batch is that long, or on steps of more than :data:`NEIGHBOUR_LIMIT`.
    ``node``: the micro-batches' :func:`node_times`, when made already."""
    if len(items) > NEIGHBOUR_LIMIT:
        return None
    sizes = list(table.node_sizes)
    times = on_sizes(table, items, sizes, node)
    gpu = times * np.asarray(sizes, dtype=float)
    if not np.isfinite(gpu).any(axis=1).all():
        return None
    pref = np.argmin(gpu, axis=1)
    own = times[np.arange(len(items)), pref]
    ranks = np.asarray(sizes)[pref]
    big = own > lower_bound(times, sizes, inp.world_size) / 2
    order = np.argsort(-own, kind="stable").tolist()
    first, left = [], inp.world_size
    for j in order:
        if big[j] and ranks[j] <= left:
            first.append(j)
            left -= int(ranks[j])
    if not first:
        return None
    span, room = float(own[first].max()), left * float(own[first].max())
    chosen = set(first)
    for j in order:  # fillers: the longest that fit the ranks left, for as long
        if j not in chosen and own[j] <= span and gpu[j, pref[j]] <= room:
            first.append(j)
            room -= float(gpu[j, pref[j]])
    chosen = set(first)
    rest = [j for j in range(len(items)) if j not in chosen]
    if not rest:
        return None
    return _in_phases(inp, table, items, (first, rest), k, node)


def _in_phases(
    inp: PolicyInput,
    table: OptionTable,
    items: list[Item],
    parts: tuple[Sequence[int], ...],
    k: int,
    node: np.ndarray | None,
    exact_solver: bool = True,
) -> Iteration | None:
    """Step ``k`` with the ``items`` of each of ``parts`` (their positions) run one
    phase after another (None where a phase has too few micro-batches to cover the
    world), each phase solved on its rows of ``node`` (the items' :func:`node_times`,
    when made already: not made again per phase); ``exact_solver=False`` solves the
    phases by the heuristics alone."""
    if not exact_solver:
        inp = replace(inp, options=replace(inp.options, exact_solver=False))
    groups, placed = [], []
    for phase, rows in enumerate(parts):
        part = [items[j] for j in rows]
        times = None if node is None else node[np.asarray(rows, dtype=np.int64)]
        try:
            solved = solve_iteration(inp, table, part, times)
        except ValueError:  # too few micro-batches in a phase to cover the world
            return None
        starts = place_groups(inp.world_size, [sp for sp, _ in solved])
        groups += solved
        placed += [(start, phase) for start in starts]
    return emit_iteration(k, inp.world_size, groups, table, placed=placed)
