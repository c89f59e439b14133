"""A run resumed on its world streams its segment as a fresh start does: the first
step after the resume waits for the steps up to its own, not for the epoch's schedule;
the rebuilt schedule is still checked against the saved one (the steps that ran before
the next step is handed out, the fingerprint once it is whole; what is saved before
carries the saved fingerprint: test_resumed_saves.py). The build is held back on
purpose, so no test reads a clock."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from run_config import small_config
from test_streamed_schedule import HeldBack, small_loop

from datacentric.cli.inspect import inspect_run
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.train.checkpoints.checkpoint_folders import TRAINER_FILE
from datacentric.train.hooks import StepControl, StepHooks
from datacentric.train.run_folder import SCHEDULES
from datacentric.train.schedule_ahead import StreamedBuild
from datacentric.train.trainer import Trainer, train_rank

pytestmark = pytest.mark.usefixtures("one_thread")

CHANGED = "the rebuilt schedule of epoch 0 .* differs from the saved one"


def run_until(dc, iterations: int) -> list:
    """Train ``dc``'s loop until ``iterations`` steps in all; the iterations it ran."""
    ran = []
    for step in dc.steps(iterations=iterations):
        ran.append(step.iteration)
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    return ran


def saved_after(steps: int) -> dict:
    """The state of a loop that ran ``steps`` steps of its first epoch."""
    dc = small_loop(0)
    run_until(dc, steps)
    state = dc.state_dict()
    dc.close()
    return state


def held_resume(state: dict, gate: threading.Event):
    """A fresh loop loaded from ``state`` whose segment's build stops after the step the
    position stands at until ``gate`` opens; the whole-epoch builds it asks for."""
    dc = small_loop(0)
    dc.load_state_dict(state)
    stream, whole_builds = dc.pipeline.stream, []
    dc.pipeline.stream = lambda epoch=0, **kw: HeldBack(
        stream(epoch, **kw), gate, after=state["segment_iteration"]
    )
    schedule = dc.pipeline.schedule
    dc.pipeline.schedule = lambda *a, **kw: whole_builds.append(a) or schedule(*a, **kw)
    return dc, whole_builds


def test_a_resumed_run_s_first_step_waits_for_its_own_step_not_the_epoch():
    state = saved_after(2)
    whole = small_loop(0).pipeline.schedule(0)
    gate = threading.Event()
    dc, whole_builds = held_resume(state, gate)
    announced, ran = [], []
    for step in dc.steps(iterations=5, on_schedule=lambda s, at: announced.append(s)):
        if not ran:  # the epoch is not built yet: step 3 did not wait for it
            assert announced == [] and whole_builds == []
            gate.set()
        ran.append(step.iteration)
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    dc.close()
    assert ran == list(whole.iterations[2:5])
    assert [s.iterations for s in announced] == [whole.iterations]
    assert dc.state_dict()["segment_fingerprint"] == schedule_fingerprint(whole)


def test_a_changed_schedule_on_resume_is_refused_once_it_is_whole():
    """(``state_dict()`` does not wait for it: test_resumed_saves.py.)"""
    state = saved_after(2)
    gate = threading.Event()
    changed = {**state, "segment_fingerprint": "0" * 32}  # the rebuilt one differs
    dc, _ = held_resume(changed, gate)
    steps = dc.steps(iterations=5)
    step = next(steps)  # its steps before it are the ones the position ran
    gate.set()
    for micro in step:
        micro.backward(dc.model(micro.batch))
    step.finish()
    with pytest.raises(ValueError, match=CHANGED):
        dc.current_schedule()  # waits for the whole schedule: checked
    with pytest.raises(ValueError, match=CHANGED):
        next(steps)
    dc.close()


@pytest.mark.parametrize("fingerprint", [True, False], ids=["fingerprint", "none-saved"])
def test_a_resume_whose_ran_steps_differ_is_refused_before_its_first_step(fingerprint):
    state = saved_after(2)
    ran = state["consumed"]
    moved = {**state, "consumed": ran[1:] + ran[:1]}  # the same samples, another order
    if not fingerprint:  # saved on a stop by signal while its epoch was being built
        moved["segment_fingerprint"] = ""
    dc, whole_builds = held_resume(moved, threading.Event())  # the build never goes on
    with pytest.raises(ValueError, match=CHANGED):
        next(dc.steps(iterations=5))
    assert whole_builds == []
    dc.close()


def test_stop_building_saves_the_position_as_it_stands_without_the_whole_schedule():
    """A resumed segment held after its step 3: after step 3, ``stop_building`` lets
    ``state_dict`` return at once with the saved fingerprint (not re-verified, nothing
    announced), and a loop loaded from that state checks it and runs the next steps."""
    state = saved_after(2)
    whole = small_loop(0).pipeline.schedule(0)
    gate = threading.Event()
    dc, whole_builds = held_resume(state, gate)
    announced = []
    steps = dc.steps(iterations=5, on_schedule=lambda s, at: announced.append(s))
    step = next(steps)
    for micro in step:
        micro.backward(dc.model(micro.batch))
    step.finish()
    dc.stop_building()
    steps.close()
    stopped = dc.state_dict()  # held back still: this did not wait for the build
    assert not gate.is_set() and announced == [] and whole_builds == []
    assert stopped["segment_fingerprint"] == state["segment_fingerprint"]
    assert stopped["segment_iteration"] == 3
    gate.set()
    dc.close()
    again = small_loop(0)
    again.load_state_dict(stopped)
    ran = run_until(again, 5)
    again.close()
    assert ran == list(whole.iterations[3:5])
    assert again.state_dict()["segment_fingerprint"] == schedule_fingerprint(whole)


def test_a_position_past_its_segment_s_end_is_refused_before_a_build():
    state = saved_after(2)
    length = len(small_loop(0).pipeline.schedule(0).iterations)
    dc, _ = held_resume({**state, "segment_iteration": length + 1}, threading.Event())
    with pytest.raises(ValueError, match=f"at iteration {length + 1} of a {length}-iteration"):
        next(dc.steps(iterations=length + 5))
    dc.close()


class TermAfter(StepHooks):
    """Hooks that send this process SIGTERM after step ``step`` (a cluster's preemption)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def step_end(self, record: dict) -> StepControl:
        if record["iteration"] + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
        return StepControl()


@pytest.mark.slow
def test_a_stop_by_signal_saves_without_waiting_for_the_epoch_s_build(tmp_path, monkeypatch):
    """A SIGTERM after step 2 while the epoch's build is held after its step 3: the save
    cancels the build instead of waiting for it (the position holds no fingerprint), and
    the resume continues as the run without a stop did, to the same weights."""
    straight = train_rank(small_config(tmp_path / "straight", iterations=4))
    gate, waited = threading.Event(), []
    stream, schedule = Pipeline.stream, StreamedBuild.schedule
    with monkeypatch.context() as patch:
        patch.setattr(
            Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
        )  # the whole schedule is asked for: the build goes on, and the wait is seen
        patch.setattr(
            StreamedBuild, "schedule", lambda s: waited.append(1) or gate.set() or schedule(s)
        )
        out = tmp_path / "stopped"
        stopped = Trainer(small_config(out, iterations=4), hooks=TermAfter(2)).run()
    assert stopped.stopped_by_signal == signal.SIGTERM and stopped.iterations_done == 2
    assert waited == [] and not gate.is_set()  # saved while the build was held
    gate.set()
    saved = inspect_run(str(out))
    assert saved["iterations_done"] == 2
    trainer = json.loads((out / "checkpoints" / saved["checkpoint"] / TRAINER_FILE).read_text())
    assert trainer["position"]["segment_fingerprint"] == ""  # a fresh epoch's: none yet
    assert not (out / SCHEDULES).exists() or not any((out / SCHEDULES).iterdir())
    resumed = train_rank(small_config(out, iterations=4, resume=True))
    assert resumed.iterations_done == 4
    assert resumed.losses == straight.losses[2:]
    assert resumed.weights_sha256 == straight.weights_sha256
    assert [p.name for p in (out / SCHEDULES).iterdir()] == ["epoch-0.json"]
