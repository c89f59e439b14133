"""Assigning micro-batches to SP groups of mixed sizes: layout, LPT, local search.

The problem of one iteration: items ``j`` (micro-batches) with a time ``t[j, s]``
on a group of ``s`` ranks (infinite where they do not fit), a world of ``W``
ranks. Choose group sizes (powers of two summing to ``W``) and give every group a
non-empty list of items so that the largest group time (the makespan) is least.

- :func:`proportional_layout` sizes the groups from where the load naturally goes
  (each item's cheapest size), in proportion to GPU-seconds;
- :func:`lpt` places items longest first on the group where they would finish
  earliest (largest processing time first, for unrelated machines);
- :func:`local_search` then moves and swaps items off the makespan group while
  that lowers it;
- :func:`fill_empty` makes sure every group runs something.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-12
#: Most answers :func:`local_search` keeps (then it forgets them all and starts again).
SEARCH_MEMO_SIZE = 256
_search_memo: dict[tuple, np.ndarray] = {}


def proportional_layout(
    world_size: int,
    sizes: Sequence[int],
    load: np.ndarray,
    max_groups: int,
    longest: np.ndarray | None = None,
    items: np.ndarray | None = None,
) -> list[int]:
    """Group sizes (one entry per group) for a world whose size classes carry
    ``load[k]`` GPU-seconds (items that prefer ``sizes[k]``), at most ``max_groups``.

    Apportioned greedily (D'Hondt-like): every loaded class gets a group, then the
    class whose groups would run longest, ``max(load / (size * groups), longest)``,
    gets another while that shortens it and its size fits the ranks left. Ranks still
    left become groups of the smallest loaded size (cheapest for small items to move
    to). ``longest[k]``: the longest item of class ``k``; ``items[k]``: how many it
    has (a class never gets more groups than items).
    """
    sizes_arr = np.asarray(sizes, dtype=float)
    longest = np.zeros(len(sizes)) if longest is None else np.asarray(longest, dtype=float)
    items = np.full(len(sizes), np.inf) if items is None else np.asarray(items, dtype=float)
    counts = np.zeros(len(sizes), dtype=int)
    left = world_size
    for k in np.argsort(-load, kind="stable"):
        if load[k] > 0 and sizes[k] <= left:
            counts[k] += 1
            left -= sizes[k]
    while left:
        span = np.maximum(load / (sizes_arr * np.maximum(counts, 1)), longest)
        after = np.maximum(load / (sizes_arr * (counts + 1)), longest)
        ok = (sizes_arr <= left) & (load > 0) & (counts < items) & (after < span * (1 - 1e-9))
        if not ok.any():
            break
        k = int(np.argmax(np.where(ok, span, -np.inf)))
        counts[k] += 1
        left -= sizes[k]
    loaded = [k for k in range(len(sizes)) if load[k] > 0] or [0]
    for k in loaded + list(range(len(sizes) - 1, -1, -1)):
        while sizes[k] <= left:
            counts[k] += 1
            left -= sizes[k]
    layout = [s for s, c in zip(sizes, counts) for _ in range(c)]
    return merge_groups(world_size, layout, max_groups)


def rounded_layout(
    world_size: int, sizes: Sequence[int], times: np.ndarray, bump: int | None = None
) -> list[int]:
    """Group sizes by rounding each class's share of the world to whole groups.

    Each item prefers its cheapest size; a class whose load rounds to no group at all
    (a few long items among many short ones) is closed and its items re-prefer their
    next-cheapest size, so that no group is opened for a sliver of work and then
    filled with items that run better elsewhere. Ranks left over, or taken away to
    fit the world, go to or come from the classes whose groups run longest/shortest.
    ``bump``: give that class one group more than rounding does (a neighbouring layout).
    """
    size_arr = np.asarray(sizes, dtype=float)
    allowed = np.ones(len(sizes), dtype=bool)
    while True:
        cost = np.where(allowed[None, :], times * size_arr, np.inf)
        pref = np.argmin(cost, axis=1)
        load = np.bincount(pref, weights=cost[np.arange(len(times)), pref], minlength=len(sizes))
        share = load / (load.sum() / world_size) / size_arr
        counts = np.floor(share + 0.5).astype(int)
        orphans = np.flatnonzero((load > 0) & (counts == 0))
        if len(orphans) == 0:
            break
        k = int(orphans[np.argmin(load[orphans])])
        allowed[k] = False
        if not np.isfinite(np.where(allowed[None, :], times, np.inf)).any(axis=1).all():
            allowed[k] = True  # its items fit nowhere else: keep one group
            counts[k] = 1
            break
    counts = np.maximum(counts, (load > 0).astype(int))
    keep = np.zeros(len(sizes), dtype=int)
    if bump is not None and load[bump] > 0 and sizes[bump] <= world_size:
        counts[bump] += 1
        keep[bump] = counts[bump]
    span = lambda: load / (size_arr * np.maximum(counts, 1))  # noqa: E731
    while (counts * size_arr).sum() > world_size:  # take the group missed least
        after = load / (size_arr * np.maximum(counts - 1, 1))
        if ((counts > 1) & (counts > keep)).any():
            k = int(np.argmin(np.where((counts > 1) & (counts > keep), after, np.inf)))
        else:  # one group per class is too many: close the lightest class that can go
            k = lightest_closable(times, pref, counts, load)
        counts[k] -= 1
    left = world_size - int((counts * size_arr).sum())
    while left:
        fits = (size_arr <= left) & (load > 0)
        if not fits.any():
            fits = size_arr <= left
        k = int(np.argmax(np.where(fits, span(), -np.inf)))
        counts[k] += 1
        left -= sizes[k]
    return [s for s, c in zip(sizes, counts) for _ in range(c)]


def lightest_closable(
    times: np.ndarray, pref: np.ndarray, counts: np.ndarray, load: np.ndarray
) -> int:
    """The open class of least load whose items all fit on another open class (else the
    least loaded open class)."""
    open_classes = np.flatnonzero(counts > 0)
    movable = []
    for k in open_classes.tolist():
        others = [c for c in open_classes.tolist() if c != k]
        rows = times[pref == k][:, others]
        if others and np.isfinite(rows).any(axis=1).all():
            movable.append(k)
    pool = movable or open_classes.tolist()
    return min(pool, key=lambda k: (load[k], k))


def merge_groups(world_size: int, layout: list[int], max_groups: int) -> list[int]:
    """Merge the smallest groups pairwise (two of size s make one of 2s) until there
    are at most ``max_groups``; a world that is not a power of two ends as one group."""
    layout = sorted(layout)
    while len(layout) > max(1, max_groups):
        s = layout[0]
        if len(layout) > 1 and layout[1] == s and world_size % (2 * s) == 0:
            layout = sorted([2 * s, *layout[2:]])
        else:
            layout = [world_size]
    return layout


def lpt(
    times: np.ndarray,
    group_class: Sequence[int],
    class_sizes: Sequence[int],
    order: Sequence[int] | None = None,
    target: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Largest-processing-time-first placement.

    ``times[j, k]``: time of item ``j`` on a group of size ``class_sizes[k]``;
    ``group_class[g]``: class of group ``g``. Items go, longest (by their best
    time) first, to the group where they finish earliest, the one costing fewer
    GPU-seconds among equals. With ``target`` (a makespan to aim for), an item goes
    instead to the group costing the fewest GPU-seconds among those where it would
    finish within ``target`` (earliest among equals), when there is one: filler
    items then stay on the sizes that run them cheapest. Returns ``(owner, loads)``:
    the group of every item and the load of every group.
    """
    n_items, n_classes = times.shape
    loads = [0.0] * len(group_class)
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(n_classes)]
    for g, k in enumerate(group_class):
        heaps[k].append((0.0, g))
    for h in heaps:
        heapq.heapify(h)
    if order is None:
        order = np.argsort(-times.min(axis=1), kind="stable")
    owner = [-1] * n_items
    rows = times.tolist()
    # (Python lists, each class's heap and size bound once: not numpy's element writes)
    usable = [(k, heaps[k], class_sizes[k]) for k in range(n_classes) if heaps[k]]
    inf, replace = math.inf, heapq.heapreplace
    for j in np.asarray(order).tolist():
        row = rows[j]
        best_h, best, best_cost = None, inf, inf
        within = False  # whether best finishes within the target
        for k, heap, size in usable:
            t = row[k]
            if t != inf:
                finish = heap[0][0] + t
                cost = size * t
                if target is not None and finish <= target:
                    if not within or cost < best_cost or (cost == best_cost and finish < best):
                        best_h, best, best_cost, within = heap, finish, cost, True
                elif not within and (finish < best or (finish == best and cost < best_cost)):
                    best_h, best, best_cost = heap, finish, cost
        if best_h is None:
            raise ValueError(f"item {j} fits no group of this layout")
        _, g = replace(best_h, (best, best_h[0][1]))
        loads[g] = best
        owner[j] = g
    return np.asarray(owner, dtype=np.int64), np.asarray(loads, dtype=np.float64)


@dataclass
class _Search:
    """The state :func:`local_search` moves items in (arrays changed in place)."""

    times: np.ndarray
    group_class: np.ndarray
    class_sizes: np.ndarray
    owner: np.ndarray
    t_own: np.ndarray
    """Each item's time on its own group."""
    loads: np.ndarray
    counts: np.ndarray
    held: list[set[int]]
    """Each group's items, kept as moves and swaps go (an O(n) scan per move otherwise)."""
    columns: list[np.ndarray]
    """Each size class's column of ``times`` (every item's time on it), contiguous."""
    owner_class: np.ndarray
    """Each item's group's class, kept as items move."""
    by_class: np.ndarray
    """The groups ordered by class (stable): each present class's groups in a row."""
    class_starts: np.ndarray
    """Where each present class's groups start in :attr:`by_class`."""
    present: np.ndarray
    """The classes some group has, ascending."""
    slot: np.ndarray
    """Each group's place in :attr:`by_class`."""
    scratch: np.ndarray
    """Per-item work space of :func:`_swap_off` (five rows of floats): a swap allocates
    nothing the size of the step (arrays that large cost a fresh mapping each: on the 26
    searches of 22,500 micro-batches at 1,024 GPUs, 2.5 s with them, 1.3 s without)."""

    def moved(self, items: tuple[int, ...]) -> None:
        """Bring :attr:`owner_class` up to date after ``items`` moved."""
        for j in items:
            self.owner_class[j] = self.group_class[self.owner[j]]


def local_search(
    times: np.ndarray,
    group_class: np.ndarray,
    class_sizes: Sequence[int],
    owner: np.ndarray,
    max_moves: int,
) -> np.ndarray:
    """Move or swap items off the makespan group while that lowers the makespan; a
    move goes where it costs the fewest GPU-seconds among the groups where it helps.

    Keeps every group non-empty if it was. Returns the new ``owner``.

    A pure function of its arguments, so the answer for the same arguments (by value)
    is remembered: dcp-opt's layout search asks again with the same start (targets that
    LPT reaches alike, the same layout under two preference views), a quarter of the
    calls on 200,000 samples at 64 GPUs and most of their time.
    """
    group_class, class_sizes, owner = map(np.asarray, (group_class, class_sizes, owner))
    times = np.asarray(times, dtype=np.float64)  # (every caller's; the work space's)
    key = (
        times.shape,
        times.dtype.str,
        np.ascontiguousarray(times).tobytes(),
        group_class.astype(np.int64).tobytes(),
        class_sizes.astype(np.int64).tobytes(),
        owner.dtype.str,
        owner.tobytes(),
        int(max_moves),
    )
    found = _search_memo.get(key)
    if found is None:
        found = _local_search(times, group_class, class_sizes, owner, max_moves)
        if len(_search_memo) >= SEARCH_MEMO_SIZE:
            _search_memo.clear()
        _search_memo[key] = found
    return found.copy()


def _local_search(
    times: np.ndarray,
    group_class: np.ndarray,
    class_sizes: np.ndarray,
    owner: np.ndarray,
    max_moves: int,
) -> np.ndarray:
    """:func:`local_search`, computed."""
    n_groups = len(group_class)
    owner = owner.copy()
    t_own = times[np.arange(len(owner)), group_class[owner]]
    order = np.argsort(owner, kind="stable")
    cuts = np.searchsorted(owner[order], np.arange(n_groups + 1)).tolist()
    by_group = order.tolist()
    state = _Search(
        times=times,
        group_class=group_class,
        class_sizes=class_sizes,
        owner=owner,
        t_own=t_own,
        loads=np.bincount(owner, weights=t_own, minlength=n_groups),
        counts=np.bincount(owner, minlength=n_groups),
        held=[set(by_group[a:b]) for a, b in zip(cuts, cuts[1:])],
        columns=[np.ascontiguousarray(times[:, k]) for k in range(times.shape[1])],
        owner_class=group_class[owner],
        scratch=np.empty((5, len(owner))),
        **_class_runs(group_class),
    )
    # (array methods, not numpy's functions: those pass through a dispatcher on each of
    # the 24,000 moves and swaps of the searches at 1,024 GPUs)
    for _ in range(max_moves):
        top = int(state.loads.argmax())
        if not state.held[top]:
            break
        members = np.array(sorted(state.held[top]), dtype=np.int64)
        members = members.take((-t_own.take(members)).argsort(kind="stable"))
        if state.counts[top] > 1 and _move_off(state, top, members):
            continue
        if not _swap_off(state, top, members):
            break
    return owner


def _move_off(state: _Search, top: int, members: np.ndarray) -> bool:
    """Move one item of the top group (longest first) to the group where it costs the
    fewest GPU-seconds among those where the makespan drops; False if none does."""
    times, group_class, loads = state.times, state.group_class, state.loads
    peak = loads[top]
    # The first member (longest first) that some other group takes in time: per size
    # class, the least loaded group of it other than the top one decides (addition is
    # monotone, so this is the test over every group). The classes' least loads in one
    # pass over the groups ordered by class.
    others = loads.take(state.by_class)
    others[state.slot[top]] = np.inf
    least = np.minimum.reduceat(others, state.class_starts)
    if len(least) < times.shape[1]:  # classes no group has: none takes an item
        every = np.full(times.shape[1], np.inf)
        every[state.present] = least
        least = every
    reach = (least + times.take(members, axis=0)).min(axis=1)
    helps = (reach < peak - EPS).nonzero()[0]
    for j in members[helps[:1]]:
        t_j = times[j].take(group_class)  # j on each group
        finish = loads + t_j
        finish[top] = np.inf
        ok = (finish < peak - EPS).nonzero()[0]
        if len(ok):
            gpu = state.class_sizes.take(group_class.take(ok)) * t_j.take(ok)
            h = int(ok[np.lexsort((finish.take(ok), gpu))[0]])
            loads[top] -= state.t_own[j]
            loads[h] = finish[h]
            state.counts[top] -= 1
            state.counts[h] += 1
            state.owner[j], state.t_own[j] = h, times[j, group_class[h]]
            state.held[top].discard(int(j))
            state.held[h].add(int(j))
            state.moved((int(j),))
            return True
    return False


def _swap_off(state: _Search, top: int, members: np.ndarray) -> bool:
    """Exchange one of the top group's 8 longest items with a shorter one elsewhere
    where that lowers both groups below the makespan; False if no exchange does."""
    times, group_class, loads = state.times, state.group_class, state.loads
    owner, t_own = state.owner, state.t_own
    peak = loads[top]
    t_i_here = state.columns[group_class[top]]  # each item on the top group
    others_left, t_j_there, new_top, new_other, worst = state.scratch
    # (indices in range: "clip" takes straight into ``out``, "raise" through a buffer)
    loads.take(owner, out=others_left, mode="clip")
    np.subtract(others_left, t_own, out=others_left)  # each item's group without it
    for j in members[:8]:
        times[j].take(state.owner_class, out=t_j_there, mode="clip")  # j on its group
        np.add(peak - t_own[j], t_i_here, out=new_top)
        np.add(others_left, t_j_there, out=new_other)
        np.maximum(new_top, new_other, out=worst)
        worst[members] = np.inf  # items elsewhere only
        i = _least_below(worst, peak - EPS)
        if i is not None:
            h = int(owner[i])
            loads[top], loads[h] = new_top[i], new_other[i]
            owner[i], owner[j] = top, h
            t_own[i], t_own[j] = t_i_here[i], t_j_there[i]
            state.held[top].discard(int(j))
            state.held[h].discard(i)
            state.held[top].add(i)
            state.held[h].add(int(j))
            state.moved((i, int(j)))
            return True
    return False


def _class_runs(group_class: np.ndarray) -> dict[str, np.ndarray]:
    """:class:`_Search`'s view of the groups by class (``by_class``, ``class_starts``,
    ``present``, ``slot``)."""
    by_class = np.argsort(group_class, kind="stable")
    present = np.unique(group_class)
    slot = np.empty(len(group_class), dtype=np.int64)
    slot[by_class] = np.arange(len(group_class))
    starts = np.searchsorted(group_class[by_class], present)
    return {"by_class": by_class, "class_starts": starts, "present": present, "slot": slot}


def _least_below(values: np.ndarray, limit: float) -> int | None:
    """The first index of the least of ``values`` below ``limit`` (None: none is): the
    least overall when it is below (no NaN before it), else the masked search."""
    i = int(values.argmin())
    least = values[i]
    if least < limit:
        return i
    if least == least:  # not NaN: the least is not below, so none is
        return None
    cand = np.flatnonzero(values < limit)  # (a NaN: argmin stops at it)
    return int(cand[np.argmin(values[cand])]) if len(cand) else None


def cut_gpu_seconds(
    times: np.ndarray,
    group_class: np.ndarray,
    class_sizes: Sequence[int],
    owner: np.ndarray,
) -> np.ndarray:
    """Move items to groups where they cost fewer GPU-seconds, never past the current
    makespan: a filler item on a larger group than it needs goes back to a group of its
    cheapest size that has room. The makespan does not rise; the time freed on the
    groups it left lets :func:`local_search` lower it. Keeps every group non-empty if
    it was. Returns the new ``owner``."""
    class_sizes = np.asarray(class_sizes)
    n_groups = len(group_class)
    owner = owner.copy()
    gpu = times * class_sizes[None, :]
    t_own = times[np.arange(len(owner)), group_class[owner]]
    loads = np.bincount(owner, weights=t_own, minlength=n_groups)
    counts = np.bincount(owner, minlength=n_groups)
    cap = float(loads.max())
    present = np.unique(group_class)
    own_gpu = gpu[np.arange(len(owner)), group_class[owner]]
    penalty = own_gpu - gpu[:, present].min(axis=1)
    for j in np.argsort(-penalty, kind="stable").tolist():
        if penalty[j] <= EPS:
            break
        g = owner[j]
        if counts[g] <= 1:
            continue
        cost = gpu[j, group_class]
        finish = loads + times[j, group_class]
        ok = np.flatnonzero((cost < own_gpu[j] - EPS) & (finish <= cap + EPS))
        if len(ok) == 0:
            continue
        h = int(ok[np.lexsort((finish[ok], cost[ok]))[0]])
        loads[g] -= t_own[j]
        loads[h] = finish[h]
        counts[g] -= 1
        counts[h] += 1
        owner[j], t_own[j], own_gpu[j] = h, times[j, group_class[h]], cost[h]
    return owner


def fill_empty(times: np.ndarray, group_class: np.ndarray, owner: np.ndarray) -> bool:
    """Give every empty group an item taken from a group that has several, choosing
    the move that keeps the makespan lowest. Returns False if some group stays empty."""
    n_groups = len(group_class)
    while True:
        counts = np.bincount(owner, minlength=n_groups)
        empty = np.flatnonzero(counts == 0)
        if len(empty) == 0:
            return True
        g = int(empty[0])
        t_own = times[np.arange(len(owner)), group_class[owner]]
        loads = np.bincount(owner, weights=t_own, minlength=n_groups)
        movable = (counts[owner] > 1) & np.isfinite(times[:, group_class[g]])
        if not movable.any():
            return False
        cand = np.flatnonzero(movable)
        worst = np.maximum(times[cand, group_class[g]], loads[owner[cand]] - t_own[cand])
        owner[int(cand[np.argmin(worst)])] = g


def makespan(times: np.ndarray, group_class: np.ndarray, owner: np.ndarray) -> float:
    """Largest group time of an assignment."""
    t_own = times[np.arange(len(owner)), group_class[owner]]
    return float(np.bincount(owner, weights=t_own, minlength=len(group_class)).max())
