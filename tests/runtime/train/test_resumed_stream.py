"""A run resumed on its world streams its segment as a fresh start does: the first
step after the resume waits for the steps up to its own, not for the epoch's schedule;
the rebuilt schedule is still checked against the saved one (the steps that ran before
the next step is handed out, the fingerprint once it is whole) and nothing is saved
before it is. The build is held back on purpose, so no test reads a clock."""

from __future__ import annotations

import threading

import pytest
from run_config import small_config
from test_streamed_schedule import HeldBack, small_loop

from datacentric.cli.inspect import inspect_run
from datacentric.scheduling import resume
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.train.schedule_ahead import StreamedBuild
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")

CHANGED = "the rebuilt schedule of epoch 0 .* differs from the saved one"


def saved_after(steps: int) -> dict:
    """The state of a loop that ran ``steps`` steps of its first epoch."""
    dc = small_loop(0)
    for step in dc.steps(iterations=steps):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
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


def test_a_changed_schedule_on_resume_is_refused_and_nothing_is_saved_before():
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
        dc.state_dict()  # waits for the whole schedule: checked before it is saved
    with pytest.raises(ValueError, match=CHANGED):
        next(steps)
    dc.close()


def test_a_resume_whose_ran_steps_differ_is_refused_before_its_first_step():
    state = saved_after(2)
    ran = state["consumed"]
    moved = {**state, "consumed": ran[1:] + ran[:1]}  # the same samples, another order
    dc, whole_builds = held_resume(moved, threading.Event())  # the build never goes on
    with pytest.raises(ValueError, match=CHANGED):
        next(dc.steps(iterations=5))
    assert whole_builds == []
    dc.close()


def test_a_position_past_its_segment_s_end_is_refused_before_a_build():
    state = saved_after(2)
    length = len(small_loop(0).pipeline.schedule(0).iterations)
    dc, _ = held_resume({**state, "segment_iteration": length + 1}, threading.Event())
    with pytest.raises(ValueError, match=f"at iteration {length + 1} of a {length}-iteration"):
        next(dc.steps(iterations=length + 5))
    dc.close()


@pytest.mark.slow
def test_train_refuses_a_changed_schedule_on_resume_before_its_next_checkpoint(
    tmp_path, monkeypatch
):
    """A resume that saves every step, its build held until a save waits for it: the
    save checks the rebuilt schedule first, so no checkpoint follows the saved one."""
    train_rank(small_config(tmp_path, iterations=2, checkpoint_every=1))
    assert inspect_run(str(tmp_path))["iterations_done"] == 2
    gate = threading.Event()
    stream, schedule = Pipeline.stream, StreamedBuild.schedule
    monkeypatch.setattr(
        Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
    )
    monkeypatch.setattr(StreamedBuild, "schedule", lambda self: gate.set() or schedule(self))
    monkeypatch.setattr(resume, "schedule_fingerprint", lambda s: "0" * 32)  # it differs
    with pytest.raises(ValueError, match=CHANGED):
        train_rank(small_config(tmp_path, iterations=4, checkpoint_every=1, resume=True))
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert saved == ["step-00000001", "step-00000002"]
    assert inspect_run(str(tmp_path))["iterations_done"] == 2
