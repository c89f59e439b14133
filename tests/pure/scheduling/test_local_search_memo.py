"""``balance.local_search`` remembers its answers by value: the same as computing them."""

from __future__ import annotations

import numpy as np

from datacentric.scheduling import balance


def test_a_remembered_answer_is_the_computed_one_and_callers_get_their_own_copy() -> None:
    rng = np.random.default_rng(0)
    times = rng.uniform(0.5, 2.0, size=(40, 2))
    times[:, 1] *= 0.6
    group_class = np.array([0, 0, 0, 1, 1])
    sizes = [1, 2]
    owner, _ = balance.lpt(times, group_class, sizes)
    owner = np.roll(owner, 3)  # a start with room to improve
    computed = balance._local_search(times, group_class, np.asarray(sizes), owner, 50)
    first = balance.local_search(times, group_class, sizes, owner, 50)
    assert (first == computed).all() and not (first == owner).all()
    first[:] = 0  # a caller that fills its answer in place
    again = balance.local_search(times.copy(), group_class.copy(), sizes, owner.copy(), 50)
    assert (again == computed).all()
    # another argument, another answer
    other = balance.local_search(times * 1.5, group_class, sizes, owner, 50)
    assert (
        other == balance._local_search(times * 1.5, group_class, np.asarray(sizes), owner, 50)
    ).all()
    assert (balance.local_search(times, group_class, sizes, owner, 0) == owner).all()


def test_the_same_arguments_are_searched_once(monkeypatch) -> None:
    calls = []
    search = balance._local_search

    def counted(*args):
        calls.append(1)
        return search(*args)

    monkeypatch.setattr(balance, "_local_search", counted)
    times = np.array([[1.0, 0.6], [0.9, 0.5], [0.8, 0.45], [0.4, 0.25], [0.3, 0.2]])
    owner = np.array([0, 0, 0, 1, 1])
    for _ in range(3):
        balance.local_search(times.copy(), np.array([0, 1]), [1, 2], owner.copy(), 10)
    assert len(calls) == 1
