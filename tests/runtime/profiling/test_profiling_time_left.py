"""The profiler's progress says a time left that holds: it counts passes, so a round's
warm-up (several passes) and a timed pass (one) weigh what they take."""

import io

from datacentric.profiling.profiler import profiling_progress
from datacentric.settings.sections import CostConfig


def test_profiling_time_left_is_within_half_of_the_actual_from_a_fifth_on():
    cost, rounds, pass_s = CostConfig(warmup=2, repeats=3), 4, 1.0
    now = [0.0]
    bar = profiling_progress(
        rounds, cost, True, stream=io.StringIO(), terminal=False, clock=lambda: now[0]
    )
    passes = [2] * rounds + [1] * (rounds * cost.repeats)  # warm-ups, then timed passes
    assert bar.total == sum(passes)
    total_s = sum(passes) * pass_s
    checked = 0
    with bar:
        for n in passes:
            now[0] += n * pass_s
            bar.update(n)
            actual = total_s - now[0]
            if bar.done >= 0.2 * bar.total and actual > 0:
                left = float(bar.line().split("about ")[1].split(" s left")[0])
                assert abs(left - actual) <= 0.5 * actual, (bar.done, left, actual)
                checked += 1
    assert checked >= 5
