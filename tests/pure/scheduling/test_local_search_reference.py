"""``balance.local_search`` against a plain reading of its rule, item by item and group
by group: the vectorised search (classes' least loads in one pass, the swap's least by
one ``argmin``) moves and swaps exactly as the rule says, on random steps with sizes an
item cannot run on and classes of one group."""

from __future__ import annotations

import numpy as np
import pytest

from datacentric.scheduling import balance


def _reference(times, group_class, class_sizes, owner, max_moves):
    """The rule of ``local_search``, one item and one group at a time (the loads kept
    the same way: the top group less the item, the other group its finish)."""
    owner = owner.copy()
    n_groups, eps = len(group_class), balance.EPS
    t_own = times[np.arange(len(owner)), group_class[owner]]
    loads = np.bincount(owner, weights=t_own, minlength=n_groups)
    for _ in range(max_moves):
        top = int(np.argmax(loads))
        members = sorted(np.flatnonzero(owner == top).tolist(), key=lambda j: -t_own[j])
        if not members:
            break
        peak = loads[top]
        if len(members) > 1 and _reference_move(
            times, group_class, class_sizes, owner, t_own, loads, top, members
        ):
            continue
        best = None  # (worst, i, j): the first member with a swap, its least worst
        for j in members[:8]:
            for i in range(len(owner)):
                if owner[i] == top:
                    continue
                h = owner[i]
                new_top = (peak - t_own[j]) + times[i, group_class[top]]
                new_other = (loads[h] - t_own[i]) + times[j, group_class[h]]
                worst = max(new_top, new_other)
                if worst < peak - eps and (best is None or worst < best[0]):
                    best = (worst, i, j, new_top, new_other)
            if best is not None:
                break
        if best is None:
            break
        _, i, j, new_top, new_other = best
        h = owner[i]
        loads[top], loads[h] = new_top, new_other
        owner[i], owner[j] = top, h
        t_own[i], t_own[j] = times[i, group_class[top]], times[j, group_class[h]]
    return owner


def _reference_move(times, group_class, class_sizes, owner, t_own, loads, top, members):
    peak = loads[top]
    for j in members:
        found = None  # (GPU-seconds, finish, group)
        for g in range(len(group_class)):
            finish = loads[g] + times[j, group_class[g]]
            if g != top and finish < peak - balance.EPS:
                key = (class_sizes[group_class[g]] * times[j, group_class[g]], finish, g)
                found = key if found is None or key < found else found
        if found is not None:
            h = found[2]
            loads[top] -= t_own[j]
            loads[h] = found[1]
            owner[j], t_own[j] = h, times[j, group_class[h]]
            return True
    return False


@pytest.mark.parametrize("seed", range(6))
def test_local_search_moves_and_swaps_as_its_rule_says(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n_items, n_classes = int(rng.integers(6, 40)), int(rng.integers(1, 4))
        class_sizes = np.array([1, 2, 4, 8][:n_classes])
        times = rng.uniform(0.2, 3.0, size=(n_items, 1)) / class_sizes**0.8
        times = np.round(times * rng.uniform(0.9, 1.1, size=times.shape), 2)  # equal times too
        times[rng.random(times.shape) < 0.1] = np.inf  # sizes an item cannot run on
        group_class = np.sort(rng.integers(0, n_classes, size=int(rng.integers(2, 7))))
        first = times[:, group_class[0]]  # every item runs on the first group's size
        times[:, group_class[0]] = np.where(np.isfinite(first), first, 2.5)
        fits = np.isfinite(times[:, group_class])
        owner = np.array([rng.choice(np.flatnonzero(row)) for row in fits])
        moves = int(rng.integers(1, 60))
        got = balance._local_search(times, group_class, class_sizes, owner, moves)
        assert (got == _reference(times, group_class, class_sizes, owner, moves)).all()
