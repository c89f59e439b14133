"""A position saved before its segment's whole schedule was known holds the fingerprint
of the segment's first steps built by then; the rebuilt segment is checked against it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from toy_cost_model import ToyCostModel, toy_pipeline

from datacentric.scheduling.resume import (
    Position,
    begin_segment,
    check_known_steps,
    check_segment,
    continue_schedule,
    schedule_fingerprint,
    steps_fingerprint,
)
from datacentric.settings import SchedulingConfig
from datacentric.shapes import SampleShape

MODEL = ToyCostModel(capacity_bytes=16 * 2**20)
CHANGED = "the rebuilt schedule of epoch 0 .* differs from the saved one"


def schedule_and_stop(known: int = 5, ran: int = 2):
    """An epoch's schedule and a position stopped after ``ran`` of its steps, its first
    ``known`` steps built (no whole fingerprint)."""
    shapes = [SampleShape.text(100 + (i * 7919) % 1900) for i in range(120)]
    per_step = SchedulingConfig(tokens_per_iteration=12_000)
    pipeline = toy_pipeline(shapes, MODEL, world_size=4, seed=1, options=per_step)
    schedule = pipeline.schedule(measure=False)
    assert len(schedule.iterations) > known > ran
    position = Position.at(schedule, ran)
    position.segment_fingerprint = ""
    position.known_steps(known, steps_fingerprint(schedule.iterations[:known]))
    return schedule, position


def test_the_same_steps_pass_and_the_whole_fingerprint_replaces_them():
    schedule, position = schedule_and_stop()
    assert not check_known_steps(position, schedule.iterations[:4], 4, "dcp-opt")  # not yet
    assert check_known_steps(position, schedule.iterations[:5], 4, "dcp-opt")
    check_segment(position, schedule)
    assert position.segment_fingerprint == schedule_fingerprint(schedule)
    assert (position.segment_steps_known, position.segment_steps_fingerprint) == (0, "")


def test_a_step_changed_among_those_known_is_refused_naming_where():
    schedule, position = schedule_and_stop()
    steps = list(schedule.iterations)
    steps[3:5] = [replace(steps[4], index=3), replace(steps[3], index=4)]
    with pytest.raises(ValueError, match=f"{CHANGED} \\(after step 4\\)"):
        check_known_steps(position, steps, 4, "dcp-opt", "after step 4")
    with pytest.raises(ValueError, match=CHANGED):
        check_segment(position, replace(schedule, iterations=tuple(steps)))
    with pytest.raises(ValueError, match=CHANGED):  # a whole schedule of fewer steps
        check_known_steps(position, schedule.iterations[:4], 4, "dcp-opt", whole=True)


def test_a_new_segment_or_epoch_forgets_the_steps_and_older_positions_read_back():
    schedule, position = schedule_and_stop()
    state = position.to_json()
    assert state["segment_steps_known"] == 5
    begin_segment(
        position, schedule.num_samples, world_size=2
    )  # another world: the samples left re-planned
    assert (position.segment_steps_known, position.segment_steps_fingerprint) == (0, "")
    older = {k: v for k, v in state.items() if not k.startswith("segment_steps")}
    assert Position.from_json(older).segment_steps_known == 0  # saved by 0.1.0: none
    again = Position.from_json(state)
    again.next_epoch()
    assert (again.segment_steps_known, again.segment_steps_fingerprint) == (0, "")


def test_another_world_with_a_global_batch_continues_the_epoch_s_own_steps():
    """With an explicit global batch, a position saved on 1 rank, continued on 2 for two
    steps, then on 4, stands at the epoch's step and trains the uninterrupted run's next
    global batches (before: each new world re-planned the samples left into other steps);
    steps that ran otherwise are refused."""
    shapes = [SampleShape.text(100 + (i * 7919) % 1900) for i in range(120)]
    per_step = SchedulingConfig(tokens_per_iteration=12_000)

    def make(world: int):
        pipeline = toy_pipeline(shapes, MODEL, world_size=world, seed=1, options=per_step)
        return lambda epoch, ids: pipeline.schedule(epoch=epoch, sample_ids=ids, measure=False)

    whole = make(1)(0, None)
    steps = [sorted(it.sample_ids()) for it in whole.iterations]
    position = Position.at(whole, 2)
    for world, ran in ((2, 2), (4, 4)):
        rest = continue_schedule(position, len(shapes), world, make(world), same_batches=True)
        assert (position.segment_iteration, position.segment_excluded) == (ran, [])
        assert [sorted(it.sample_ids()) for it in rest.iterations] == steps
        for it in rest.iterations[ran : ran + 2]:
            position.advance(it.sample_ids(), len(rest.iterations))
    wrong = Position.at(whole, 2)
    wrong.consumed[0], wrong.consumed[-1] = wrong.consumed[-1], wrong.consumed[0]
    with pytest.raises(ValueError, match=CHANGED):
        continue_schedule(wrong, len(shapes), 2, make(2), same_batches=True)
