"""``schedule --policy static`` and ``--policy megatron-dyncp`` say a time left while
the policy searches: the search tells its progress (``searched``: static in the
micro-batches it prices, megatron-dyncp in the steps it prices) and ``StepsHeld`` counts
it; replayed on a scripted clock, a recorded run's time left holds from a fifth of the
work on, where the steps alone (the former count) say nothing till the search ends."""

from __future__ import annotations

import io

from datacentric.cli.schedule import StepsHeld
from datacentric.progress import Progress

#: ``schedule --dataset sft-longtail --world 64 --policy static`` recorded on 2 shared
#: cores: (seconds since the policy started, micro-batches priced, their total as
#: counted then), one report in three (each change of the total kept); the 7 steps
#: came at once at STEPS_AT, the summary (measures and checks) was done at DONE_AT.
SEARCH = [
    (0.05, 0, 2225175),
    (1.45, 57147, 2162150),
    (2.47, 114293, 2262148),
    (3.43, 170752, 2359738),
    (3.96, 213327, 2409946),
    (4.05, 235428, 2412789),
    (4.09, 246515, 2412919),
    (4.11, 252091, 2313031),
    (4.13, 254911, 2213142),
    (4.15, 256351, 2114452),
    (4.16, 257407, 2041127),
    (5.72, 314554, 2102455),
    (6.75, 371701, 2102455),
    (7.76, 428159, 2101250),
    (8.39, 470735, 2076957),
    (8.49, 492836, 2041127),
    (8.58, 509499, 2012211),
    (8.6, 512318, 1997744),
    (8.63, 513743, 1990479),
    (8.67, 515130, 1986711),
    (11.74, 685882, 1986711),
    (12.44, 761646, 1986711),
    (12.51, 771465, 1986711),
    (12.56, 772867, 1986711),
    (15.67, 943620, 1986711),
    (16.37, 1019383, 1986711),
    (16.44, 1029203, 1986711),
    (16.48, 1030453, 1986711),
    (18.54, 1144913, 1986711),
    (20.18, 1266048, 1986711),
    (20.26, 1285531, 1986711),
    (20.31, 1288026, 1986711),
    (20.35, 1288381, 1986711),
    (23.45, 1459821, 1986711),
    (26.51, 1630095, 1986711),
    (29.18, 1775941, 1986711),
    (30.24, 1868831, 1986711),
    (30.43, 1916262, 1986711),
    (30.53, 1940072, 1986711),
    (30.56, 1944771, 1992441),
    (30.58, 1948732, 1991150),
    (30.61, 1952074, 1987240),
    (30.63, 1954454, 1990240),
    (30.65, 1956466, 1986829),
    (30.67, 1958167, 1983959),
    (30.69, 1959388, 1978399),
    (30.73, 1959916, 1978399),
    (30.79, 1960708, 1978399),
    (30.85, 1961541, 1978399),
    (30.92, 1962456, 1978399),
    (30.98, 1963371, 1978399),
    (31.04, 1964451, 1978399),
    (31.11, 1965531, 1978399),
    (31.18, 1966741, 1978399),
    (31.24, 1968016, 1978399),
    (31.32, 1969369, 1978399),
    (31.4, 1970878, 1978399),
    (31.47, 1972386, 1978399),
    (31.55, 1974171, 1978399),
    (31.63, 1975956, 1978399),
    (31.67, 1977079, 1978399),
    (31.69, 1977871, 1978399),
    (31.73, 1978399, 1978399),
]
STEPS_AT = 31.73
DONE_AT = 32.46


#: ``schedule --dataset sft-longtail --world 64 --policy megatron-dyncp`` recorded on 2
#: shared cores: (seconds since the policy started, steps priced (one whose micro-batches
#: are formed counting two), their total as counted then), each change kept; the 7 steps
#: came at once at MEGATRON_STEPS_AT, the summary was done at MEGATRON_DONE_AT.
MEGATRON_SEARCH = [
    (0.04, 0, 150),
    (0.41, 2, 150),
    (0.65, 4, 150),
    (0.88, 6, 150),
    (1.11, 8, 150),
    (1.11, 8, 102),
    (1.33, 10, 102),
    (1.54, 12, 102),
    (1.75, 14, 102),
    (1.96, 16, 102),
    (2.15, 18, 102),
    (2.34, 20, 102),
    (2.54, 22, 102),
    (2.73, 24, 102),
    (2.99, 26, 102),
    (3.24, 28, 102),
    (3.43, 30, 102),
    (3.69, 32, 102),
    (3.8, 33, 102),
    (3.91, 34, 102),
    (4.02, 35, 102),
    (4.14, 36, 102),
    (4.21, 37, 102),
    (4.29, 38, 102),
    (4.36, 39, 102),
    (4.43, 40, 102),
    (4.65, 42, 102),
    (4.85, 44, 102),
    (5.05, 46, 102),
    (5.05, 46, 100),
    (5.27, 48, 100),
    (5.51, 50, 100),
    (5.75, 52, 100),
    (5.98, 54, 100),
    (6.22, 56, 100),
    (6.49, 58, 100),
    (6.49, 58, 96),
    (6.78, 60, 96),
    (6.78, 60, 90),
    (6.81, 60, 87),
    (6.87, 61, 87),
    (7.08, 63, 87),
    (7.13, 64, 87),
    (7.34, 66, 87),
    (7.39, 67, 87),
    (7.62, 69, 87),
    (7.68, 70, 87),
    (7.78, 71, 87),
    (7.86, 72, 87),
    (7.92, 73, 87),
    (8.0, 74, 87),
    (8.05, 75, 87),
    (8.14, 76, 87),
    (8.2, 77, 87),
    (8.3, 78, 87),
    (8.54, 80, 87),
    (8.6, 81, 87),
    (8.86, 83, 87),
    (8.92, 84, 87),
    (9.16, 86, 87),
    (9.22, 87, 87),
]
MEGATRON_STEPS_AT = 9.37
MEGATRON_DONE_AT = 10.05


def replay(
    hear_search: bool,
    search: list[tuple[float, int, int]] = SEARCH,
    steps_at: float = STEPS_AT,
    done_at: float = DONE_AT,
) -> list[tuple[float, float | None, float]]:
    """The time left read at each quarter of every wait from a fifth of the work on,
    as (when, said, actual seconds left); ``hear_search``: the callback has ``searched``;
    ``search``, ``steps_at``, ``done_at``: the recorded run (static's by default)."""
    now = [0.0]
    bar = Progress(
        "schedule static steps", 1, stream=io.StringIO(), terminal=False, time_left=True,
        clock=lambda: now[0],
    )  # fmt: skip
    held = StepsHeld(bar)
    events = [(at, "search", done, total) for at, done, total in search]
    events += [(steps_at, "steps", 7, 7), (done_at, "done", 0, 0)]
    seen, before = [], 0.0
    with bar:
        for at, kind, done, total in events:
            for quarter in (1, 2, 3, 4):
                now[0] = before + (at - before) * quarter / 4
                if now[0] >= 0.2 * done_at and done_at - now[0] >= 1:
                    seen.append((now[0], bar.left.seconds(now[0]), done_at - now[0]))
            before = at
            if kind == "search" and hear_search:
                held.searched(done, total)
            elif kind == "steps":
                held(done, total)
        bar.update()  # as schedule_summary does once the policy's summary is made
    return seen


def test_the_recorded_static_search_says_a_time_left_within_half_from_a_fifth_on():
    seen = replay(hear_search=True)
    bad = [s for s in seen if s[1] is None or abs(s[1] - s[2]) > 0.5 * s[2] + 1]
    assert len(seen) >= 100 and not bad, bad


def test_the_steps_alone_say_nothing_while_static_searches():
    seen = replay(hear_search=False)
    assert seen and all(s[1] is None for s in seen if s[0] < STEPS_AT)


def test_the_recorded_megatron_search_says_a_time_left_within_half_from_a_fifth_on():
    seen = replay(True, MEGATRON_SEARCH, MEGATRON_STEPS_AT, MEGATRON_DONE_AT)
    bad = [s for s in seen if s[1] is None or abs(s[1] - s[2]) > 0.5 * s[2] + 1]
    assert len(seen) >= 100 and not bad, bad


def test_the_steps_alone_say_nothing_while_megatron_searches():
    seen = replay(False, MEGATRON_SEARCH, MEGATRON_STEPS_AT, MEGATRON_DONE_AT)
    assert seen and all(s[1] is None for s in seen if s[0] < MEGATRON_STEPS_AT)
