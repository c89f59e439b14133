"""``schedule``'s progress counts the epoch's steps as the policy builds them, the last
one only once the schedule is measured and checked (``last_step_held``): replayed on a
scripted clock, a recorded run's time left holds from a fifth of the work on."""

from __future__ import annotations

import io

import pytest

from datacentric.cli.schedule import last_step_held
from datacentric.progress import Progress

#: ``schedule --dataset sft-longtail --world 64 --policy dcp-opt`` (the docs' example),
#: recorded on 2 shared cores: the seconds at which the data and the plan were ready,
#: each of the 7 steps was built (the first carries dcp-opt's search), and the summary
#: was done (the epoch's measures and checks, 4.1 s, after the last step).
PLANNED_AT = 4.299
STEPS_AT = [15.003, 26.023, 41.246, 49.218, 54.963, 66.572, 72.022]
DONE_AT = 76.120


def replay(on_step_of, steps_at: list[float], done_at: float) -> list[tuple]:
    """The steps' progress fed by ``on_step_of(progress)`` at ``steps_at``; the time left
    read at each quarter of every wait from a fifth of the work on, as (when, said,
    actual seconds left)."""
    now = [PLANNED_AT]
    bar = Progress(
        "schedule dcp-opt steps", 1, stream=io.StringIO(), terminal=False, time_left=True,
        clock=lambda: now[0],
    )  # fmt: skip
    on_step, seen, before = on_step_of(bar), [], PLANNED_AT
    with bar:
        for number, at in enumerate([*steps_at, done_at], 1):
            for quarter in (1, 2, 3, 4):
                now[0] = before + (at - before) * quarter / 4
                if now[0] >= 0.2 * done_at and done_at - now[0] >= 1:
                    seen.append((now[0], bar.left.seconds(now[0]), done_at - now[0]))
            before = at
            if number <= len(steps_at):
                on_step(number, len(steps_at))
        on_step(len(steps_at), len(steps_at))  # the whole schedule, told again
        bar.update()  # as schedule_summary does once the policy's summary is made
    assert bar.done == bar.total == len(steps_at)
    return seen


def test_the_recorded_schedule_says_a_time_left_within_half_from_a_fifth_on():
    seen = replay(last_step_held, STEPS_AT, DONE_AT)
    bad = [s for s in seen if s[1] is None or abs(s[1] - s[2]) > 0.5 * s[2] + 1]
    assert len(seen) >= 25 and not bad, bad


def test_counting_the_last_step_when_built_says_nothing_while_the_epoch_is_measured():
    """Without the hold, the count is whole at the last step and the 4 s of measures
    that follow have no time left."""
    seen = replay(lambda bar: bar.reached, STEPS_AT, DONE_AT)
    assert [s for s in seen if s[0] > STEPS_AT[-1]] and all(
        s[1] is None for s in seen if s[0] > STEPS_AT[-1]
    )


@pytest.mark.parametrize("done", [1, 6, 7])
def test_the_last_step_waits_for_the_summary(done):
    bar = Progress("steps", 1, enabled=False)
    last_step_held(bar)(done, 7)
    assert (bar.done, bar.total) == (min(done, 6), 7)
