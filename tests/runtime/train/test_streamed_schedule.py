"""The first epoch's steps stream: step 1 waits for its own step, not for the epoch's
schedule, and the steps that run are the whole-epoch build's (``schedule_wait_s`` of
step 1 is recorded; the whole schedule is announced, saved and fingerprinted once it
is built). The build is held back on purpose here, so no test reads a clock."""

from __future__ import annotations

import json
import sys
import threading

import pytest
from run_config import small_config
from test_schedule_ahead import small_loop as schedule_ahead_loop

from datacentric.schedule import Schedule
from datacentric.scheduling import dcp_opt
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.train.data_centric import DataCentric
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.run_folder import SCHEDULES
from datacentric.train.schedule_ahead import StreamedBuild
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def small_loop(prefetch: int = 2) -> DataCentric:
    """A small model on two corpus files, 1,024 tokens a step (a dozen steps an epoch)."""
    return schedule_ahead_loop(prefetch, files=2, tokens=1024)


class HeldBack:
    """An epoch's stream that stops after its step ``after`` until :attr:`gate` opens."""

    def __init__(self, stream, gate: threading.Event, after: int = 0) -> None:
        self.stream, self.gate, self.after = stream, gate, after
        self.num_steps = stream.num_steps
        self.opened: bool | None = None

    def __iter__(self):
        for k, iteration in enumerate(self.stream):
            yield iteration
            if k == self.after:
                self.opened = self.gate.wait(60)  # False: nobody opened it (a minute)

    def schedule(self):
        return self.stream.schedule()


@pytest.mark.parametrize("prefetch", [2, 0], ids=["prefetch", "no-prefetch"])
def test_the_first_step_runs_before_the_rest_of_the_epoch_is_built(prefetch):
    dc = small_loop(prefetch)
    gate = threading.Event()
    held: list[HeldBack] = []
    stream = dc.pipeline.stream
    dc.pipeline.stream = lambda epoch=0, **kw: (
        held.append(HeldBack(stream(epoch, **kw), gate)) or held[-1]
    )
    announced = []
    ran, waits = [], []
    for step in dc.steps(iterations=4, on_schedule=lambda s, at: announced.append((s, at))):
        if not ran:
            assert dc.current_length() > 4  # known before the steps are built
            assert announced == []  # the epoch is not built yet: step 1 did not wait for it
            gate.set()
        ran.append(step.iteration)
        waits.append(step.schedule_wait_s)
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    dc.close()
    assert held[0].opened is True  # step 1 came while the build was held after its step
    assert waits[0] > 0.0  # the plan and the global batches, on the loop's thread
    whole = small_loop().pipeline.schedule(0)  # the whole-epoch build, in another object
    assert ran == list(whole.iterations[:4])
    assert len(announced) == 1 and announced[0][1] is None
    assert announced[0][0].iterations == whole.iterations
    state = dc.state_dict()
    assert state["segment_fingerprint"] == schedule_fingerprint(whole)


def test_a_checkpoint_of_a_streaming_epoch_resumes_on_the_same_steps():
    """state_dict() waits for the whole schedule (its fingerprint); a fresh loop loaded
    from it rebuilds the epoch, checks it and runs the steps the first loop would."""
    dc = small_loop(0)
    for step in dc.steps(iterations=2):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    state = dc.state_dict()
    assert state["segment_fingerprint"]
    whole = dc.current_schedule()
    again = small_loop(0)
    again.load_state_dict(state)
    nxt = next(iter(again.steps(iterations=3)))
    assert nxt.iteration == whole.iterations[2]


@pytest.mark.slow
def test_train_logs_step_1s_schedule_wait_and_saves_the_whole_schedule(tmp_path):
    """A run that ends inside its first epoch records step 1's wait and saves the
    epoch's whole schedule, whose first steps are the ones it ran."""
    config = small_config(tmp_path, iterations=3, tokens_per_iteration=1024)
    train_rank(config)
    records = read_metrics(tmp_path)
    assert len(records) == 3 and records[0]["schedule_wait_s"] > 0.0
    saved = json.loads((tmp_path / SCHEDULES / "epoch-0.json").read_text())
    schedule = Schedule.from_json(saved)
    schedule.validate()
    assert len(schedule.iterations) > 3  # the whole epoch, not the steps that ran
    ran = [(r["samples"], r["est_makespan_s"]) for r in records]
    assert ran == [(len(it.sample_ids()), it.est_makespan_s) for it in schedule.iterations[:3]]


@pytest.mark.skipif(sys.platform != "linux", reason="the build forks on Linux only")
def test_a_build_in_its_own_process_hands_out_the_whole_builds_steps(monkeypatch):
    """The epoch's steps built in a forked process are the whole build's; an error of
    the build is raised where its step is taken, the steps before it handed out."""
    dc = small_loop(0)
    build = StreamedBuild(dc.pipeline.stream(0), name="schedule-epoch-0")
    assert build._pid is not None
    steps = [build.step(k)[0] for k in range(build.num_steps)]
    schedule, _ = build.schedule()
    whole = small_loop(0).pipeline.schedule(0)
    assert steps == list(whole.iterations) and schedule.iterations == whole.iterations
    own_step = dcp_opt.own_step

    def planted(inp, table, chunk, k, *rest):
        if k == 2:
            raise ValueError("planted: step 3 fits nothing")
        return own_step(inp, table, chunk, k, *rest)

    monkeypatch.setattr(dcp_opt, "own_step", planted)  # the forked process inherits it
    failing = StreamedBuild(small_loop(0).pipeline.stream(0), name="schedule-epoch-0")
    assert failing.step(1)[0] == whole.iterations[1]
    with pytest.raises(ValueError, match="planted: step 3 fits nothing"):
        failing.step(2)
