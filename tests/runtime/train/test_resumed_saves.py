"""A resumed segment's position is saved without waiting for its whole schedule: it
holds the record it was resumed from (the whole fingerprint, else that of its first
steps), checked once the rebuilt schedule is whole, where a difference stops the run
naming the step. A stop on a signal early in an epoch saves the fingerprint of the
steps built so far, which the resume checks. The build is held back on purpose, so no
test reads a clock."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from run_config import small_config
from test_resumed_stream import CHANGED, held_resume, run_until, saved_after
from test_streamed_schedule import HeldBack, small_loop

from datacentric.scheduling import resume
from datacentric.scheduling.pipeline import Pipeline
from datacentric.scheduling.resume import schedule_fingerprint, steps_fingerprint
from datacentric.train.checkpoints.checkpoint_folders import (
    TRAINER_FILE,
    checkpoint_step,
    list_checkpoints,
)
from datacentric.train.hooks import StepHooks
from datacentric.train.schedule_ahead import StreamedBuild
from datacentric.train.trainer import Trainer, train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def watch_whole_builds(monkeypatch, gate: threading.Event) -> list:
    """Each wait for a streamed segment's whole schedule, recorded (the gate opens then,
    so that a wait never hangs a test)."""
    waited: list = []
    schedule = StreamedBuild.schedule
    monkeypatch.setattr(
        StreamedBuild, "schedule", lambda s: waited.append(1) or gate.set() or schedule(s)
    )
    return waited


def one_step(dc, steps) -> None:
    step = next(steps)
    for micro in step:
        micro.backward(dc.model(micro.batch))
    step.finish()


def test_a_resumed_segment_s_position_is_saved_without_waiting_for_its_schedule(monkeypatch):
    state = saved_after(2)
    whole = small_loop(0).pipeline.schedule(0)
    gate = threading.Event()
    waited = watch_whole_builds(monkeypatch, gate)
    dc, whole_builds = held_resume(state, gate)
    steps = dc.steps(iterations=5)
    one_step(dc, steps)
    saved = dc.state_dict()  # the build is held after step 3: not waited for
    assert waited == [] and whole_builds == [] and not gate.is_set()
    assert saved["segment_iteration"] == 3
    assert saved["segment_fingerprint"] == state["segment_fingerprint"]  # carried forward
    gate.set()
    ran = [step.iteration for step in run_steps(dc, steps)]
    dc.close()
    assert ran == list(whole.iterations[3:5])
    assert dc.state_dict()["segment_fingerprint"] == schedule_fingerprint(whole)


def run_steps(dc, steps):
    """Run the rest of ``steps``, yielding each."""
    for step in steps:
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
        yield step


def test_a_changed_schedule_found_once_whole_stops_the_run_naming_the_step(monkeypatch):
    state = saved_after(2)
    gate = threading.Event()
    watch_whole_builds(monkeypatch, gate)
    changed = {**state, "segment_fingerprint": "0" * 32}  # the rebuilt one differs
    dc, _ = held_resume(changed, gate)
    steps = dc.steps(iterations=12)
    one_step(dc, steps)
    assert dc.state_dict()["segment_fingerprint"] == "0" * 32  # saved as it was resumed
    gate.set()
    found = r"found after step \d+, once its whole schedule was built: steps? 3(-\d)? ran "
    with pytest.raises(
        ValueError, match=f"{CHANGED}.*{found}unchecked since the position saved after step 2"
    ):
        list(run_steps(dc, steps))
    dc.close()


def swapped(stream, k: int):
    """``stream`` with its steps ``k`` and ``k + 1`` swapped: a schedule that differs
    after its first ``k`` steps (as another dataset or setting gives)."""

    class Swapped:
        num_steps = stream.num_steps

        def __iter__(self):
            self.built = list(stream)  # on the build's thread
            self.built[k : k + 2] = [
                replace(self.built[k + 1], index=k),
                replace(self.built[k], index=k + 1),
            ]
            yield from self.built

        def schedule(self):
            return replace(stream.schedule(), iterations=tuple(self.built))

    return Swapped()


def stopped_early(held_after: int) -> dict:
    """A fresh loop's position saved on a stop after 2 steps, its build held after its
    step ``held_after`` (``stop_building``, as on a signal)."""
    dc = small_loop(0)
    gate = threading.Event()
    stream = dc.pipeline.stream
    dc.pipeline.stream = lambda epoch=0, **kw: HeldBack(stream(epoch, **kw), gate, held_after)
    steps = dc.steps(iterations=8)
    one_step(dc, steps)
    one_step(dc, steps)
    for _ in range(6000):  # until the build reaches the step it is held after
        if dc._build.built() > held_after:
            break
        threading.Event().wait(0.01)
    dc.stop_building()
    steps.close()
    state = dc.state_dict()
    gate.set()
    dc.close()
    return state


def test_a_stop_early_in_an_epoch_saves_the_fingerprint_of_the_steps_built():
    state = stopped_early(held_after=4)
    whole = small_loop(0).pipeline.schedule(0)
    assert state["segment_fingerprint"] == "" and state["segment_iteration"] == 2
    assert state["segment_steps_known"] == 5
    assert state["segment_steps_fingerprint"] == steps_fingerprint(whole.iterations[:5])
    again = small_loop(0)
    again.load_state_dict(state)
    ran = run_until(again, 5)  # the same schedule: checked, and it runs on
    assert ran == list(whole.iterations[2:5])
    saved = again.state_dict()  # the steps built by now, unless the whole is known
    if not saved["segment_fingerprint"]:
        known = saved["segment_steps_known"]
        assert known >= 5
        assert saved["segment_steps_fingerprint"] == steps_fingerprint(whole.iterations[:known])
    again.current_schedule()  # waits for the whole schedule
    again.close()
    saved = again.state_dict()
    assert saved["segment_fingerprint"] == schedule_fingerprint(whole)
    assert saved["segment_steps_known"] == 0


def test_a_stop_early_in_an_epoch_resumed_on_another_schedule_is_refused():
    """The steps that ran are the same (the samples compared before the first step pass);
    step 4 of the rebuilt schedule is not the one built before the stop."""
    state = stopped_early(held_after=4)
    dc = small_loop(0)
    dc.load_state_dict(state)
    stream = dc.pipeline.stream
    dc.pipeline.stream = lambda epoch=0, **kw: swapped(stream(epoch, **kw), 3)
    found = r"found after step \d, once its (first 5 steps were|whole schedule was) built"
    with pytest.raises(ValueError, match=f"{CHANGED}.*{found}"):
        run_until(dc, 6)
    dc.close()


class GateAfterSave(StepHooks):
    """Hooks that open ``gate`` once the checkpoint of step ``step`` is complete,
    recording how many whole builds were waited for by then."""

    def __init__(self, gate: threading.Event, waited: list, step: int) -> None:
        self.gate, self.waited, self.step, self.seen = gate, waited, step, None

    def saved(self, step: int, folder: Path) -> None:
        if step == self.step:
            self.seen = len(self.waited)
            self.gate.set()


def saved_position(out: Path, step: int) -> dict:
    folder = out / "checkpoints" / f"step-{step:08d}"
    return json.loads((folder / TRAINER_FILE).read_text())["position"]


@pytest.mark.slow
def test_a_resumed_run_s_first_checkpoint_does_not_wait_for_the_epoch(tmp_path, monkeypatch):
    """A resume that saves every step, its build held after step 3 until the step-3
    checkpoint is complete: that checkpoint is written without the whole schedule, holds
    the saved fingerprint, and the run ends as the run without a stop did."""
    straight = train_rank(small_config(tmp_path / "straight", iterations=5))
    out = tmp_path / "resumed"
    train_rank(small_config(out, iterations=2, checkpoint_every=1))
    gate = threading.Event()
    waited = watch_whole_builds(monkeypatch, gate)
    stream = Pipeline.stream
    monkeypatch.setattr(
        Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
    )
    hooks = GateAfterSave(gate, waited, 3)
    resumed = Trainer(small_config(out, iterations=5, checkpoint_every=1, resume=True), hooks=hooks)
    result = resumed.run()
    assert hooks.seen == 0  # the step-3 checkpoint waited for no whole build
    assert (
        saved_position(out, 3)["segment_fingerprint"]
        == saved_position(out, 2)["segment_fingerprint"]
    )
    assert (
        saved_position(out, 5)["segment_fingerprint"]
        == saved_position(out, 2)["segment_fingerprint"]
    )
    assert result.losses == straight.losses[2:]
    assert result.weights_sha256 == straight.weights_sha256


@pytest.mark.slow
def test_train_stops_on_a_changed_schedule_found_after_its_resume(tmp_path, monkeypatch):
    """A resume whose rebuilt schedule differs (its fingerprint), its build held until the
    step-3 checkpoint is complete: the run stops once the schedule is whole, naming the
    step; each checkpoint written since holds the saved fingerprint and is marked, so the
    next resume passes over it (test_refused_saves.py) and is refused as well."""
    train_rank(small_config(tmp_path, iterations=2, checkpoint_every=1))
    kept = saved_position(tmp_path, 2)["segment_fingerprint"]
    gate = threading.Event()
    waited = watch_whole_builds(monkeypatch, gate)
    stream = Pipeline.stream
    monkeypatch.setattr(
        Pipeline, "stream", lambda self, *a, **kw: HeldBack(stream(self, *a, **kw), gate, 2)
    )
    monkeypatch.setattr(resume, "schedule_fingerprint", lambda s: "0" * 32)  # it differs
    again = small_config(tmp_path, iterations=6, checkpoint_every=1, resume=True)
    found = r"\(found after step [3-6], once its whole schedule was built: steps? 3(-\d)? ran "
    with pytest.raises(ValueError, match=f"{CHANGED} {found}unchecked since .* step 2\\)"):
        Trainer(again, hooks=GateAfterSave(gate, waited, 3)).run()
    last = max(checkpoint_step(p) for p in list_checkpoints(tmp_path))
    assert 3 <= last < 6
    for step in range(3, last + 1):
        assert saved_position(tmp_path, step)["segment_fingerprint"] == kept
    with pytest.raises(ValueError, match=CHANGED):
        train_rank(small_config(tmp_path, iterations=6, checkpoint_every=1, resume=True))


@pytest.mark.parametrize("end", ["limit", "left"])
def test_a_loop_resumed_on_a_changed_schedule_is_refused_at_its_end_before_it_is_whole(end):
    """A user loop (no ``on_schedule``) that ends (its limit) or is left (closed) before
    the resumed segment's schedule is whole: it waits there for the schedule and refuses
    the difference, as the trainer's loop does, so that a run never ends quietly on a
    changed schedule (its ``state_dict()`` carries the saved fingerprint)."""
    state = saved_after(2)
    gate = threading.Event()
    changed = {**state, "segment_fingerprint": "0" * 32}  # the rebuilt one differs
    dc, _ = held_resume(changed, gate)
    steps = dc.steps(iterations=3 if end == "limit" else 8)
    one_step(dc, steps)  # step 3, the last within the limit
    assert dc.state_dict()["segment_fingerprint"] == "0" * 32  # not waited for
    gate.set()  # the rest of the schedule is built once the step has run
    with pytest.raises(ValueError, match=f"{CHANGED}.*found after step 3, once its whole"):
        if end == "limit":
            next(steps, None)  # the loop ends
        else:
            steps.close()  # the loop is left
    dc.close()


@pytest.mark.parametrize("fingerprint", [True, False], ids=["fingerprint", "none-saved"])
def test_a_resume_whose_ran_steps_differ_is_refused_when_its_schedule_is_asked_first(fingerprint):
    """The steps that ran are compared with the rebuilt ones also where the whole
    schedule is built before the first step (``current_schedule()`` asked first): with no
    record of the schedule saved (a stop by an earlier version) nothing else compares
    them, and a saved fingerprint does not cover the position's own samples."""
    state = saved_after(2)
    ran = state["consumed"]
    moved = {**state, "consumed": ran[1:] + ran[:1]}  # the same samples, another order
    if not fingerprint:
        moved["segment_fingerprint"] = ""
    gate = threading.Event()
    gate.set()  # the build goes on
    dc, _ = held_resume(moved, gate)
    with pytest.raises(ValueError, match=CHANGED):
        dc.current_schedule()
        next(dc.steps(iterations=5))
    dc.close()
