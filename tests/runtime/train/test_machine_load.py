"""Other jobs' share of the cores, measured from the cores' busy time where the OS counts
it: the verdict follows the measurement over a load average that still remembers an
earlier run of our own, and a job that spins beside us is seen."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from datacentric.train.comparison.machine_load import (
    CpuClock,
    LoadReading,
    cores_busy_s,
    describe_start,
)


def reading(others_cores, before=(1.9, 1.0, 0.5), after=(1.9, 1.5, 0.8), cpu=190.0):
    return LoadReading(
        cores=2,
        ranks=2,
        before=before,
        after=after,
        rank_cpu_s=cpu,
        rank_wall_s=200.0,
        others_cores=others_cores,
    )


def test_measured_share_decides_over_the_load_average():
    # the load average still counts a run of ours that just ended; the cores were idle
    idle = reading(others_cores=0.05)
    assert not idle.under_load
    assert "other jobs kept 0.05 of them busy" in idle.describe()
    assert idle.to_json()["others_cores"] == pytest.approx(0.05)
    # a job keeping a core busy beside the ranks, whatever the load averages said
    busy = reading(others_cores=0.9, before=(0.0, 0.0, 0.0), after=(2.0, 1.0, 0.5))
    assert busy.under_load and "UNDER LOAD" in busy.describe()
    # not measured: the load averages stand in
    assert reading(others_cores=None).under_load
    # starved ranks count whatever the measurement
    assert reading(others_cores=0.0, cpu=60.0).under_load


def test_first_line_uses_the_measured_share_when_given():
    assert "BUSY" not in describe_start((1.9, 1.0, 0.5), 2, busy_now=0.1)
    assert "0.10 busy now" in describe_start((1.9, 1.0, 0.5), 2, busy_now=0.1)
    assert "BUSY" in describe_start((0.0, 0.0, 0.0), 2, busy_now=1.5)
    assert "BUSY" in describe_start((1.9, 1.0, 0.5), 2)


def test_clock_difference_counts_others_and_not_our_own_time():
    start = CpuClock(cores_busy_s=100.0, own_s=10.0, wall_s=0.0)
    # 30 busy core-seconds in 20 s, 24 of them ours: others kept 0.3 cores busy
    assert start.others_cores(CpuClock(130.0, 34.0, 20.0)) == pytest.approx(0.3)
    assert start.others_cores(CpuClock(110.0, 25.0, 20.0)) == 0.0  # never negative
    assert start.others_cores(CpuClock(None, 34.0, 20.0)) is None
    # ranks that are not our children to wait for report their own CPU time
    assert start.others_cores(CpuClock(130.0, 12.0, 20.0), ours_s=22.0) == pytest.approx(0.3)


@pytest.mark.skipif(cores_busy_s() is None, reason="the OS does not count busy time")
def test_a_job_spinning_beside_us_is_seen():
    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)  # past the interpreter's start
        start = CpuClock.now()
        time.sleep(0.8)
        others = start.others_cores(CpuClock.now())
    finally:
        child.wait()
    # the spinning child (not yet waited for, so not ours) keeps about one core busy;
    # on a crowded machine it gets less, but other jobs then add their own share
    assert others is not None and others > 0.4, others
