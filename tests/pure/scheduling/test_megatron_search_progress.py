"""``megatron-dyncp`` tells how far its search and build are (``on_step.searched``, in
steps priced), which a command's progress line turns into a time left while no step is
out yet; the schedule is the same with or without a listener."""

from __future__ import annotations

from test_search_progress import MODEL, Listener
from toy_cost_model import mixed_text, toy_pipeline

from datacentric.scheduling.resume import schedule_fingerprint


def test_megatron_tells_its_search_in_steps_priced_and_builds_the_same_schedule():
    shapes = mixed_text(1000, seed=2)
    plain = toy_pipeline(shapes, MODEL, world_size=8).schedule(policy="megatron-dyncp")
    heard = Listener()
    told = toy_pipeline(shapes, MODEL, world_size=8).schedule(
        policy="megatron-dyncp", on_step=heard
    )
    assert schedule_fingerprint(told) == schedule_fingerprint(plain)
    done = [d for d, _ in heard.search]
    assert len(set(done)) > 10 and done == sorted(done)  # many reports, never backwards
    assert heard.search[-1][0] == heard.search[-1][1] > 0  # it ends at its total
    assert all(d <= t for d, t in heard.search)
    totals = [t for _, t in heard.search]
    assert totals[0] >= totals[-1]  # counted up front, only dropped as the search learns
