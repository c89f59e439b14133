"""``run_policies(..., workers=N)`` builds the policies at once, each in its own process:
the same results as one after another, and one time left from the running stages' own
estimates (replayed from recorded ``simulate`` runs on a scripted clock)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from datacentric.data.workloads import get_workload
from datacentric.progress import Progress
from datacentric.sim.policy_comparison import (
    OLD_BOUND,
    StageSteps,
    policy_table,
    run_policies,
    simulation_cost_model,
)
from datacentric.sim.stages_at_once import Watch, fork_context

#: The parent's view of ``datacentric simulate --dataset P --world W`` (every default
#: policy at once), recorded on 2 cores shared with other work: per preset the run's end
#: (seconds) and each report as it arrived, [when, "begun" | "heard" | "ended", policy,
#: CPU seconds of its process, what it told, its arguments]; ``python -m
#: tests.pure.sim.record_simulate_traces`` records them again.
TRACES = json.loads((Path(__file__).parent / "simulate_traces.json").read_text())

needs_fork = pytest.mark.skipif(fork_context() is None, reason="no fork on this platform")


def seconds_left(line: str) -> float | None:
    said = re.search(r"about (?:(\d+) min )?(\d+) s left$", line)
    return None if said is None else 60 * int(said[1] or 0) + int(said[2])


def on_idle_cores(log: list[list], cores: float) -> tuple[list[list], float]:
    """The reports as they arrive when the stages share ``cores`` evenly (one each at
    most) from the first one's start: each at the time its stage reaches the CPU seconds
    it reported (the recording's machine gave them what others left); and the end."""
    work = {policy: cpu for _, told, policy, cpu, *_ in log if told == "ended"}
    start = log[0][0]
    marks = {policy: [(start, 0.0)] for policy in work}
    now, running = start, set(work)
    while running:
        rate = min(1.0, cores / len(running))
        now += min(work[p] - marks[p][-1][1] for p in running) / rate
        for policy in list(running):
            spent = marks[policy][-1][1] + (now - marks[policy][-1][0]) * rate
            marks[policy].append((now, spent))
            running -= {policy} if spent >= work[policy] - 1e-9 else set()

    def when(policy: str, cpu: float) -> float:
        for (t0, c0), (t1, c1) in zip(marks[policy], marks[policy][1:]):
            if cpu <= c1 + 1e-9:
                return t0 + (t1 - t0) * (min(cpu, c1) - c0) / max(c1 - c0, 1e-9)
        return marks[policy][-1][0]

    timed = sorted(
        ([when(report[2], report[3]), *report[1:]] for report in log),
        key=lambda report: (report[0], report[1] != "begun", report[1] == "ended"),
    )
    return timed, now


def replay(trace: dict, cores: float):
    """Each report of ``trace``, on ``cores`` idle cores, told at its time to a
    :class:`Watch` that a progress line follows; every quarter second from 20% of the run
    on (till its last second): (the line's time left, the time the run still took,
    whether stages ran, each with its own estimate within half of its own CPU seconds
    left)."""
    log, end = on_idle_cores(trace["log"], cores)
    spent = {policy: cpu for _, told, policy, cpu, *_ in log if told == "ended"}
    now = [0.0]
    bar = Progress(
        "simulate", 8, stream=io.StringIO(), terminal=False, time_left=True, clock=lambda: now[0]
    )
    watch = Watch(lambda: now[0], StageSteps)
    watch.start = log[0][0]
    bar.follow(watch.outlook)
    for tick in range(int(end * 4)):
        while log and log[0][0] <= tick / 4:
            now[0], told, *args = log.pop(0)
            getattr(watch, told)(*args)
        now[0] = tick / 4
        if watch.stages and now[0] >= 0.2 * end and end - now[0] >= 1:  # stages run
            owns = [(s.left()[1], spent[p] - s.cpu) for p, s in watch.stages.items() if not s.ended]
            held = bool(owns) and all(
                own is not None and abs(own - left) <= 0.5 * left + 0.5 for own, left in owns
            )
            yield seconds_left(bar.line()), end - now[0], held
    bar.close()


def test_the_time_left_of_stages_at_once_holds_where_each_stage_s_own_does():
    """The recorded runs as on an idle 2-core machine: wherever each running stage's own
    estimate holds within half (its CPU seconds left), the one time left of them all
    holds within half of the time the run still took (a second more: lines say whole
    seconds), on 1 core and on 2, for 130 readings and more each; the combination adds
    no miss (each stage's wall pace instead misses on both)."""
    for cores in (1, 2):
        checked, missed = 0, []
        for preset, trace in sorted(TRACES.items()):
            for said, actual, held in replay(trace, cores):
                if held:
                    checked += 1
                    if said is None or abs(said - actual) > 0.5 * actual + 1:
                        missed.append((preset, said, round(actual, 1)))
        assert checked >= 130 and not missed, (cores, checked, missed)


#: Per preset, the readings off by more than half (and a second) of those from a fifth of
#: the recorded run on, on 2 idle cores and on 1, as the time left stands, each in the
#: first 0.5 s of the stages: no time left said before any stage has a pace
#: (stdlib-code, whose stages start 1.6 s into a run of 3.0 s on 2 cores and 4.4 s on 1).
#: A search with no pace yet counts as long as the longest estimate, but no longer than
#: its whole count's pace (before: opensora-balanced's first reading on 2 cores, its
#: former bound's 25-step search counted as dcp-opt's 5.1 s, said 10 s for 5.8).
MISSES = {
    2: {"longctx-1m@64": 0, "opensora-balanced@32": 0, "opensora-long@32": 0,
        "opensora-short@32": 0, "sft-longtail@64": 0, "stdlib-code@8": 1},
    1: {"longctx-1m@64": 0, "opensora-balanced@32": 0, "opensora-long@32": 0,
        "opensora-short@32": 0, "sft-longtail@64": 0, "stdlib-code@8": 2},
}  # fmt: skip


def test_the_recorded_runs_say_a_time_left_within_half_from_a_fifth_on_as_counted():
    """Every reading from a fifth of each recorded run on, held or not: no more off by
    more than half (and a second) than :data:`MISSES`: 1 on 2 cores and 2 on 1, each in
    the first 0.5 s of the stages. The same six runs recorded the same hour with the
    code before (the former bound priced before the stages began, 1.1 s of CPU on
    longctx-1m; static's search told once per candidate, its pace waiting 2.8 s of CPU
    on sft-longtail; dcp-opt's token-packed step makers, made once in its first step,
    pacing its later steps) miss 5 on 2 cores (longctx-1m 2, opensora-balanced 2,
    opensora-short 1) and 9 on 1 (longctx-1m 3, opensora-balanced 1, opensora-long 2,
    stdlib-code 3); the recordings before those missed 4 and 9."""
    for cores, expected in MISSES.items():
        for preset, trace in sorted(TRACES.items()):
            readings = list(replay(trace, cores))
            missed = [
                (said, round(actual, 1))
                for said, actual, _ in readings
                if said is None or abs(said - actual) > 0.5 * actual + 1
            ]
            assert len(missed) <= expected[preset], (cores, preset, len(readings), missed)


def test_stages_at_once_say_their_cpu_left_over_the_cpu_they_get():
    """Two stages 10 CPU seconds in, a quarter and five eighths through their searches:
    30 and 6 CPU seconds left by their own pace; getting 1 core together, 36 s are
    left; on 2 idle cores, the longer one's 30 s at one core (the other's 6 run beside
    it)."""
    now = [0.0]
    for cores, expected in ((1, 36), (2, 30)):
        now[0] = 0.0
        watch = Watch(lambda: now[0], StageSteps)
        for policy in ("static", "dcp-opt"):
            watch.begun(policy, 0.0)
        for second in range(1, 11):  # each gets half of what the cores give
            now[0] = second * 2 / cores
            watch.heard("static", second, "searched", (second * 10, 400))
            watch.heard("dcp-opt", second, "searched", (second * 10, 160))
        _, left = watch.outlook(now[0])
        assert left == pytest.approx(expected, rel=0.02), (cores, left)


@needs_fork
def test_policies_built_at_once_equal_those_built_one_after_another():
    workload = get_workload("opensora-short", num_samples=255)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 4)
    policies = ["static", "dcp-pac", "nope", "dcp-opt"]
    made = {}
    for workers in (None, 3):
        errors: dict[str, str] = {}
        runs = run_policies(
            workload.shapes, cost_model, 4, policies, errors=errors, workers=workers
        )
        table = policy_table(runs)
        for row in table.values():
            assert row.pop("schedule_seconds") > 0
        schedules = {p: r.schedule.to_json() for p, r in runs.items()}
        for schedule in schedules.values():  # the time its build took: not a result
            assert schedule["meta"].pop("plan_seconds") > 0
        olds = {p: r.ideal_epoch_time_old_s for p, r in runs.items()}
        made[workers] = (list(runs), table, schedules, olds, errors)
    assert made[None] == made[3]
    assert made[3][0] == ["static", "dcp-pac", "dcp-opt"] and list(made[3][4]) == ["nope"]
    with pytest.raises(ValueError, match="nope"):  # without errors: the first one raises
        run_policies(workload.shapes, cost_model, 4, ["static", "nope"], workers=2)


def test_without_fork_or_with_one_worker_the_policies_are_built_in_turn(monkeypatch):
    """Where processes cannot fork, or with one worker, the stages run here one after
    another: the progress counts them by their usual cost (``stage_units``), not as one
    part each."""
    from datacentric.sim import policy_comparison

    workload = get_workload("opensora-short", num_samples=51)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 4)
    in_turn = sum(policy_comparison.stage_units(["static", "dcp-pac"]).values())
    for workers, fork in ((3, None), (1, fork_context())):
        monkeypatch.setattr(policy_comparison, "fork_context", lambda fork=fork: fork)
        bar = Progress("simulate", 1, enabled=False)
        runs = run_policies(
            workload.shapes, cost_model, 4, ["static", "dcp-pac"], progress=bar, workers=workers
        )
        assert list(runs) == ["static", "dcp-pac"] and bar.total == in_turn != 4


@needs_fork
def test_the_former_bound_is_priced_beside_the_policies_not_before_them(monkeypatch):
    """Built at once (as ``simulate`` asks: one worker per policy), the stages do not
    wait for the former bound (1.1 s of CPU on longctx-1m at 64 GPUs, priced here
    before them): it is one more process, begun with the policies, with a count, and
    each run that kept every sample gets it, as one after another. A failed bound fails
    the runs that need it, named; raised, it comes after an earlier policy's own error,
    as one after another."""
    import os

    from datacentric.scheduling.pipeline import Pipeline
    from datacentric.sim import policy_comparison
    from datacentric.sim.stages_at_once import run_at_once

    parent, real = os.getpid(), Pipeline.ideal_epoch_time

    def ideal_epoch_time(self, sample_ids=None, *, old_bound=False, searched=None):
        assert not (old_bound and os.getpid() == parent), "the former bound priced first"
        return real(self, sample_ids, old_bound=old_bound, searched=searched)

    workload = get_workload("opensora-short", num_samples=255)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 4)
    policies = ["static", "dcp-pac"]
    in_turn = run_policies(workload.shapes, cost_model, 4, policies)
    monkeypatch.setattr(Pipeline, "ideal_epoch_time", ideal_epoch_time)
    started, counts, watch_heard = [], [], Watch.heard

    def on_heard(self, stage, cpu, news="", args=()):
        counts.extend([args] if news == "searched" and stage == OLD_BOUND else [])
        watch_heard(self, stage, cpu, news, args)

    def at_once_run(stages, build, *, workers, **kwargs):
        started.append((list(stages), workers))
        return run_at_once(stages, build, workers=workers, **kwargs)

    monkeypatch.setattr(Watch, "heard", on_heard)
    monkeypatch.setattr(policy_comparison, "run_at_once", at_once_run)
    at_once = run_policies(workload.shapes, cost_model, 4, policies, workers=len(policies))
    assert started == [([OLD_BOUND, *policies], len(policies) + 1)]  # every one at once
    assert counts and counts[-1][0] == counts[-1][1] > 0
    for policy in policies:
        assert at_once[policy].ideal_epoch_time_old_s == in_turn[policy].ideal_epoch_time_old_s

    def failing(self, sample_ids=None, *, old_bound=False, searched=None):
        return 1 / 0 if old_bound else real(self, sample_ids)

    monkeypatch.setattr(Pipeline, "ideal_epoch_time", failing)
    errors: dict[str, str] = {}
    assert run_policies(workload.shapes, cost_model, 4, policies, errors=errors, workers=2) == {}
    text = "efficiency_old_bound: ZeroDivisionError: division by zero"
    assert errors == dict.fromkeys(policies, text)
    with pytest.raises(ZeroDivisionError):
        run_policies(workload.shapes, cost_model, 4, policies, workers=2)
    with pytest.raises(ValueError, match="nope"):  # the first policy's own error first
        run_policies(workload.shapes, cost_model, 4, ["nope", *policies], workers=3)

    def killed(self, sample_ids=None, *, old_bound=False, searched=None):
        return os._exit(3) if old_bound else real(self, sample_ids)

    monkeypatch.setattr(Pipeline, "ideal_epoch_time", killed)
    errors = {}
    assert run_policies(workload.shapes, cost_model, 4, policies, errors=errors, workers=2) == {}
    text = "efficiency_old_bound: RuntimeError: its process ended with exit code 3 before"
    assert all(error.startswith(text) for error in errors.values()) and len(errors) == 2


@needs_fork
@pytest.mark.parametrize("drop", [False, True])
def test_a_failing_former_bound_reads_the_same_one_after_another_and_at_once(monkeypatch, drop):
    """The former bound's pricing raising is recorded with the same text whether the
    policies are built one after another or at once, for runs that kept every sample (at
    once: the bound's own stage) and for runs that dropped some (each its own pricing)."""
    from datacentric.scheduling.pipeline import Pipeline
    from datacentric.settings import SchedulingConfig

    real = Pipeline.ideal_epoch_time

    def failing(self, sample_ids=None, *, old_bound=False, searched=None):
        return 1 / 0 if old_bound else real(self, sample_ids)

    monkeypatch.setattr(Pipeline, "ideal_epoch_time", failing)
    workload = get_workload("opensora-short", num_samples=64)
    cost_model = simulation_cost_model("stdit-1.1b", "h100-sxm", 4)
    options = SchedulingConfig(global_batch_samples=30, drop_remainder=drop)
    policies = ["static", "dcp-pac"]
    texts = []
    for workers in (None, 2):
        errors: dict[str, str] = {}
        runs = run_policies(
            workload.shapes,
            cost_model,
            4,
            policies,
            options=options,
            errors=errors,
            workers=workers,
        )
        assert runs == {}
        texts.append(errors)
    expected = "efficiency_old_bound: ZeroDivisionError: division by zero"
    assert texts[0] == texts[1] == dict.fromkeys(policies, expected)


@needs_fork
def test_a_stage_whose_process_dies_ends_with_an_error_that_says_so():
    """A worker killed (here: it exits at once) ends its stage with an error naming its
    exit code, while the others' results come back."""
    import os
    import time

    from datacentric.sim.stages_at_once import run_at_once

    ended = {}

    def build(policy, on_step):
        if policy == "lost":
            os._exit(3)
        on_step(1, 1)
        return policy.upper()

    def on_end(policy, run, error, text):
        ended[policy] = (run, text)
        return True

    watch = Watch(time.monotonic, StageSteps)
    run_at_once(["kept", "lost"], build, workers=2, watch=watch, on_end=on_end)
    assert ended["kept"] == ("KEPT", "")
    assert ended["lost"][0] is None and "exit code 3" in ended["lost"][1], ended


@needs_fork
def test_a_worker_killed_while_others_run_ends_its_stage_at_once(tmp_path):
    """A worker killed by SIGKILL 0.3 s in while another tells its progress every 50 ms
    (so the parent never waits a heartbeat for news): its stage ends with an error
    naming the signal and exit code -9 at once (its pipe ends: 2-20 ms after the kill
    here; under 0.45 s asked), and the run stops there (the other, 20 s long, is
    ended). It was noticed only once the other workers ended, then (looking for dead
    processes every 0.5 s, a second look to let their last messages come) 0.5 s or
    more after the kill."""
    import os
    import signal
    import time

    from datacentric.sim.stages_at_once import run_at_once

    ended, killed_at = {}, tmp_path / "killed_at"

    def build(policy, on_step):
        if policy == "killed":
            time.sleep(0.3)
            killed_at.write_text(repr(time.monotonic()))  # one clock for every process
            os.kill(os.getpid(), signal.SIGKILL)
        for tick in range(400):
            on_step(tick, 400)
            time.sleep(0.05)
        return policy

    def on_end(policy, run, error, text):
        ended[policy] = (run, text, time.monotonic())
        return error is None

    start = time.monotonic()
    watch = Watch(time.monotonic, StageSteps)
    run_at_once(["long", "killed"], build, workers=2, watch=watch, on_end=on_end)
    assert list(ended) == ["killed"], ended
    run, text, at = ended["killed"]
    assert run is None and "SIGKILL" in text and "exit code -9" in text, text
    late = at - float(killed_at.read_text())
    assert late < 0.45 and time.monotonic() - start < 4, (late, time.monotonic() - start)
