"""Round trips and validation of the schedule data model."""

import json

import pytest

from datacentric.schedule import (
    Assignment,
    Iteration,
    MicroBatch,
    Schedule,
    aligned_groups,
    uniform_iteration,
)
from datacentric.shapes import SampleShape, make_buckets, parse_lengths_line


def _schedule() -> Schedule:
    mb = lambda ids, rc=(): MicroBatch(
        sample_ids=ids, bucket="t<=256", tokens=10 * len(ids), recompute=rc, est_time_s=0.5
    )
    it0 = Iteration(
        index=0,
        assignments=(
            Assignment(rank_start=0, sp_size=2, micro_batches=(mb((0,), (True, False)),)),
            Assignment(rank_start=2, sp_size=1, micro_batches=(mb((1, 2)), mb((3,)))),
            Assignment(rank_start=3, sp_size=1, micro_batches=(mb((4,)),)),
        ),
    )
    it1 = uniform_iteration(1, 4, 4, [[mb((5, 6), (True, True))]])
    return Schedule(
        world_size=4,
        policy="test",
        seed=1,
        epoch=0,
        num_samples=8,
        iterations=(it0, it1),
        dropped_sample_ids=(7,),
        meta={"k": 1},
    )


def test_schedule_json_round_trip(tmp_path):
    sched = _schedule()
    sched.validate()
    again = Schedule.from_json(json.loads(json.dumps(sched.to_json())))
    assert again == sched
    assert again.meta == {"k": 1}
    path = tmp_path / "s.json"
    sched.save(str(path))
    assert Schedule.load(str(path)) == sched
    assert sched.samples_scheduled == 7
    assert len(sched.iterations[0].micro_batches_of_rank(2)) == 2


def test_shape_round_trip_and_buckets():
    shapes = [SampleShape.text(100), SampleShape.video(2, 3, 4), SampleShape.text(300)]
    assert [SampleShape.from_json(json.loads(json.dumps(s.to_json()))) for s in shapes] == shapes
    b = make_buckets(shapes)
    names = [b.buckets[i].name for i in b.bucket_of_sample]
    assert names == ["t<=256", "v2x3x4", "t<=512"]
    assert all(b.buckets[i].shape.tokens >= s.tokens for s, i in zip(shapes, b.bucket_of_sample))
    assert parse_lengths_line("5 6 7") == SampleShape.video(5, 6, 7)


def test_validation_errors_name_the_problem():
    sched = _schedule()
    bad = Schedule(
        world_size=4,
        policy="x",
        seed=0,
        epoch=0,
        num_samples=8,
        iterations=sched.iterations,
        dropped_sample_ids=(),
    )
    with pytest.raises(ValueError, match="neither scheduled nor dropped"):
        bad.validate()
    dup = Schedule(
        world_size=4,
        policy="x",
        seed=0,
        epoch=0,
        num_samples=8,
        iterations=sched.iterations,
        dropped_sample_ids=(7, 0),
    )
    with pytest.raises(ValueError, match="sample id 0 is scheduled twice"):
        dup.validate()
    with pytest.raises(ValueError, match="not aligned"):
        Assignment(
            rank_start=1, sp_size=2, micro_batches=sched.iterations[0].assignments[0].micro_batches
        )
    with pytest.raises(ValueError, match="no group"):
        Iteration(index=3, assignments=sched.iterations[0].assignments[:2]).validate(4)
    with pytest.raises(ValueError, match="zero|at least one token"):
        SampleShape.text(0)


def test_aligned_groups_cover_every_divisor():
    groups = aligned_groups(4)
    assert (0, 4) in groups and (2, 2) in groups and (3, 1) in groups
    assert len(groups) == 4 + 2 + 1


def test_phases_round_trip_and_each_phase_must_tile_the_world():
    mb = lambda i: MicroBatch(sample_ids=(i,), bucket="b", tokens=5, est_time_s=1.0 + i)
    first = Assignment(0, 2, (mb(0),))
    later = (Assignment(0, 1, (mb(1),), phase=1), Assignment(1, 1, (mb(2), mb(3)), phase=1))
    it = Iteration(index=0, assignments=(first, *later))
    it.validate(2)
    assert it.num_phases == 2
    assert [a.sp_size for a in it.assignments_for_rank(1)] == [2, 1]
    assert [m.sample_ids for _, m in it.micro_batches_of_rank(1)] == [(0,), (2,), (3,)]
    assert it.est_makespan_s == pytest.approx(1.0 + 3.0 + 4.0)
    assert Iteration.from_json(json.loads(json.dumps(it.to_json()))) == it
    assert "phase" not in first.to_json()
    with pytest.raises(ValueError, match=r"iteration 0, phase 1: ranks \[1\] have no group"):
        Iteration(index=0, assignments=(first, later[0])).validate(2)
    with pytest.raises(ValueError, match="iteration 0, phase 0: ranks"):
        Iteration(index=0, assignments=later).validate(2)
    with pytest.raises(ValueError, match="phase -1 is negative"):
        Assignment(0, 1, (mb(0),), phase=-1)
