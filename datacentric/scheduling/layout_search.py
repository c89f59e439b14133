"""``dcp-opt``'s layout search: the group sizes of one step (powers of two summing to
the world) and the assignment of its micro-batches to the groups that has the least
estimated makespan (:func:`solve_iteration`).

The candidate layouts (rounded and apportioned from where each micro-batch runs
cheapest, one group per micro-batch of half the step's bound, their neighbours:
:func:`candidate_layouts`), LPT on unrelated machines and local search on each
(:func:`assign_on_layout`: also towards target makespans, with rounds of GPU-second
cuts), then a walk to better neighbouring layouts (:func:`best_layout`); sizes past a
node where they pay; micro-batches halved where loads come in whole items
(:func:`refine_by_splitting`); HiGHS on small steps still idling above
:data:`EXACT_IDLE`; a group's short micro-batches merged across buckets
(:func:`merge_small`). Every makespan is measured against :func:`lower_bound`.
"""

from __future__ import annotations

import time

import numpy as np

from datacentric.scheduling import balance, exact
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import make_item, split_item
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import assign_to_layout, ensure_items, time_matrix
from datacentric.scheduling.policy_input import PolicyInput
from datacentric.scheduling.search_steps import laid_out, solved
from datacentric.settings.scheduling import SchedulingConfig

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
