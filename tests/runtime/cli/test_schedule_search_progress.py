"""``schedule --policy static`` says a time left while static searches: the search tells
the micro-batches it prices (``searched``) and ``StepsHeld`` counts them; replayed on a
scripted clock, a recorded run's time left holds from a fifth of the work on, where the
steps alone (the former count) say nothing till the search ends."""

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


def replay(hear_search: bool) -> list[tuple[float, float | None, float]]:
    """The time left read at each quarter of every wait from a fifth of the work on,
    as (when, said, actual seconds left); ``hear_search``: the callback has ``searched``."""
    now = [0.0]
    bar = Progress(
        "schedule static steps", 1, stream=io.StringIO(), terminal=False, time_left=True,
        clock=lambda: now[0],
    )  # fmt: skip
    held = StepsHeld(bar)
    events = [(at, "search", done, total) for at, done, total in SEARCH]
    events += [(STEPS_AT, "steps", 7, 7), (DONE_AT, "done", 0, 0)]
    seen, before = [], 0.0
    with bar:
        for at, kind, done, total in events:
            for quarter in (1, 2, 3, 4):
                now[0] = before + (at - before) * quarter / 4
                if now[0] >= 0.2 * DONE_AT and DONE_AT - now[0] >= 1:
                    seen.append((now[0], bar.left.seconds(now[0]), DONE_AT - now[0]))
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
