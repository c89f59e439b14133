"""The first epoch's steps stream: step 1 waits for its own step, not for the epoch's
schedule, and the steps that run are the whole-epoch build's (``schedule_wait_s`` of
step 1 is recorded; the whole schedule is announced, saved and fingerprinted once it
is built). The build is held back on purpose here, so no test reads a clock."""

from __future__ import annotations

import json
import pickle
import sys
import threading

import pytest
import stream_cost_models
from run_config import small_config
from test_schedule_ahead import small_loop as schedule_ahead_loop

from datacentric.schedule import Schedule
from datacentric.scheduling.epoch import EpochStream
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


def stream_with(cost_model, like: EpochStream | None = None) -> EpochStream:
    """The small loop's epoch-0 stream (or ``like``'s inputs) priced by ``cost_model(the
    stream's own cost model)``."""
    spec = (like or small_loop(0).pipeline.stream(0)).spec
    return EpochStream(**{**spec, "cost_model": cost_model(spec["cost_model"])})


@pytest.mark.skipif(sys.platform != "linux", reason="the build has a process on Linux only")
@pytest.mark.timeout(60)
def test_a_lock_another_thread_holds_when_the_build_starts_does_not_stop_the_build():
    """The build process starts afresh: a lock the build takes, held by another thread of
    this process when the build starts (a forked copy would hold it forever: the build
    sent no step and never ended), is not held there."""
    whole = small_loop(0).pipeline.schedule(0)
    stream = stream_with(stream_cost_models.Locked)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with stream_cost_models.PRICES:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(60)
    build = StreamedBuild(stream, name="schedule-epoch-0")
    release.set()
    holder.join()
    assert [build.step(k)[0] for k in range(build.num_steps)] == list(whole.iterations)
    assert build.schedule()[0].iterations == whole.iterations
    assert build._process is not None


@pytest.mark.skipif(sys.platform != "linux", reason="the build has a process on Linux only")
@pytest.mark.timeout(120)
def test_a_build_in_its_own_process_hands_out_the_whole_builds_steps():
    """The epoch's steps built in the build process are the whole build's; an error of
    the build is raised where its step is taken, the steps before it handed out."""
    whole = small_loop(0).pipeline.schedule(0)
    build = StreamedBuild(small_loop(0).pipeline.stream(0), name="schedule-epoch-0")
    assert build._process is not None
    steps = [build.step(k)[0] for k in range(build.num_steps)]
    schedule, _ = build.schedule()
    assert steps == list(whole.iterations) and schedule.iterations == whole.iterations
    failing = stream_with(lambda model: stream_cost_models.FailsAfter(model, 10**9))
    probe = EpochStream(**pickle.loads(pickle.dumps(failing.spec)))  # what the process reads
    built = iter(probe)
    next(built), next(built)
    failing.spec["cost_model"].calls = probe.spec["cost_model"].asked  # fails in step 3
    failed = StreamedBuild(failing, name="schedule-epoch-0")
    assert failed.step(1)[0] == whole.iterations[1]
    with pytest.raises(ValueError, match="planted: price .* fails"):
        failed.step(2)


def test_a_build_process_that_cannot_read_its_inputs_leaves_the_build_to_a_thread():
    """Inputs the build process cannot load (a class of the running script, a pickling
    error) are built on a thread of this process: the same steps."""
    whole = small_loop(0).pipeline.schedule(0)
    stream = stream_with(lambda model: Unreadable(model))
    build = StreamedBuild(stream, name="schedule-epoch-0")
    assert [build.step(k)[0] for k in range(build.num_steps)] == list(whole.iterations)
    assert build.schedule()[0].iterations == whole.iterations


class Unreadable(stream_cost_models.Locked):
    """Prices as the model it wraps; cannot be loaded again once pickled."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("planted: these inputs do not load")
