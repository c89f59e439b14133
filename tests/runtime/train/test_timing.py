"""The one timing record: the runtime and the simulator both produce ``Span``s; the
measured comparison reads the schedule that ran and matches spans to it by id."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_train_reliability import small_config
from toy_schedule import ToyCostModel, toy_schedule

from datacentric.data import SyntheticTextDataset
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.schedule import Assignment, Iteration, MicroBatch, Schedule
from datacentric.shapes import SampleShape
from datacentric.sim.engine import simulate
from datacentric.sim.trace import write_trace
from datacentric.timing import COMPUTE, SYNC, Span, micro_batch_id, placements
from datacentric.train.comparison.measured_comparison import measured_result
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.run_folder import load_schedule, save_schedule, schedule_path
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def test_span_round_trips_and_checks_its_kind():
    span = Span(rank=1, iteration=2, kind=COMPUTE, start_s=0.5, duration_s=0.25, micro_batch=7)
    assert Span.from_json(json.loads(json.dumps(span.to_json()))) == span
    assert span.end_s == 0.75 and span.shifted(1.0).start_s == 1.5
    sync = Span(rank=0, iteration=2, kind=SYNC, start_s=1.0, duration_s=0.0)
    assert "micro_batch" not in sync.to_json()
    with pytest.raises(ValueError, match="needs"):
        Span(0, 0, COMPUTE, 0.0, 1.0)
    with pytest.raises(ValueError, match="has no"):
        Span(0, 0, SYNC, 0.0, 1.0, micro_batch=3)
    with pytest.raises(ValueError, match="not one of"):
        Span(0, 0, "nap", 0.0, 1.0)


def test_measured_and_simulated_runs_produce_the_same_record():
    shapes = [SampleShape.text(n) for n in (24, 16, 8, 12)]
    dataset = SyntheticTextDataset(shapes)
    mbs = (
        MicroBatch((2, 0), "b", 32, recompute=(True,)),
        MicroBatch((1,), "b", 16),
        MicroBatch((3,), "b", 12),
    )
    iterations = (Iteration(0, (Assignment(0, 1, mbs),)),)
    schedule = Schedule(1, "toy", 0, 0, 4, iterations, memory_cap_bytes=2**40)
    torch.manual_seed(0)
    model = build_model("llama", num_layers=1)
    runtime = DataCentricRuntime(
        model, ProcessGroups.local(), dataset.pack, loss_tokens_function(dataset)
    )
    measured = run_step(runtime, schedule.iterations[0]).stats.spans()
    simulated = simulate(schedule, shapes, ToyCostModel()).spans
    assert {type(s) for s in measured} == {type(s) for s in simulated} == {Span}
    ids = [micro_batch_id(mb) for mb in mbs]
    assert [s.micro_batch for s in measured if s.kind == COMPUTE] == ids == [2, 1, 3]
    assert [s.micro_batch for s in simulated if s.kind == COMPUTE] == ids
    assert [s.kind for s in measured][-1] == [s.kind for s in simulated][-1] == SYNC


def _records(schedule: Schedule, seconds: float = 0.1) -> list[dict]:
    """Fake metrics records: every rank runs its group's passes back to back, then syncs."""
    records = []
    for it in schedule.iterations:
        spans = []
        for group in it.assignments:
            for rank in group.ranks:
                t = 0.0
                for mb in group.micro_batches:
                    spans.append(Span(rank, it.index, COMPUTE, t, seconds, micro_batch_id(mb)))
                    t += seconds
                spans.append(Span(rank, it.index, SYNC, t, 0.01))
        end = max(s.end_s for s in spans)
        timeline = [s.to_json() for s in spans]
        records.append({"iteration": it.index, "runtime_time_s": end, "timeline": timeline})
    return records


def test_comparison_matches_spans_by_id_not_by_position():
    schedule = toy_schedule()
    straight = measured_result("toy", schedule, _records(schedule))
    shuffled = _records(schedule)
    rng = random.Random(0)
    for record in shuffled:
        rng.shuffle(record["timeline"])
    mixed = measured_result("toy", schedule, shuffled[::-1])
    assert [it.index for it in mixed.iterations] == [1, 0]
    by_index = {it.index: it for it in mixed.iterations}
    for it in straight.iterations:
        other = by_index[it.index]
        assert (other.makespan_s, other.tokens, other.idle_share) == pytest.approx(
            (it.makespan_s, it.tokens, it.idle_share)
        )
    # iteration 0: ranks 0-1 run sample 0, rank 2 samples 1 then 2, rank 3 sample 3
    assert straight.iterations[0].makespan_s == pytest.approx(0.2)
    assert straight.iterations[0].idle_share == pytest.approx(1 - 0.5 / 0.8)
    rank2 = sorted(
        (s.start_s, s.micro_batch) for s in mixed.spans if s.rank == 2 and s.iteration == 0
    )
    assert [mb for _, mb in rank2] == [1, 2, None]  # two passes, then the sync
    assert straight.micro_batches[4].tokens == 1  # the schedule's count, as it ran


def test_comparison_reads_the_schedule_that_ran(tmp_path):
    schedule = toy_schedule()
    save_schedule(tmp_path, schedule)
    assert schedule_path(tmp_path, 0) == tmp_path / "schedules" / "epoch-0.json"
    records = _records(schedule)
    before = measured_result("toy", load_schedule(tmp_path), records)
    assert before.micro_batches[3].bucket == "b"
    # Alter the stored schedule: what the comparison attributes follows the file.
    data = json.loads(schedule_path(tmp_path, 0).read_text())
    data["iterations"][0]["assignments"][2]["micro_batches"][0]["bucket"] = "edited"
    data["iterations"][0]["assignments"][2]["micro_batches"][0]["tokens"] = 1000
    schedule_path(tmp_path, 0).write_text(json.dumps(data))
    after = measured_result("toy", load_schedule(tmp_path), records)
    assert after.micro_batches[3].bucket == "edited"
    assert after.iterations[0].tokens == before.iterations[0].tokens + 999
    # A schedule that did not run (other micro-batches) is refused, not zipped.
    other = placements(schedule)[4].iteration
    moved = Iteration(0, (Assignment(0, 4, (MicroBatch((0, 1, 2, 3), "b", 4),)),))
    wrong = Schedule(4, "toy", 0, 0, 6, (moved, other))
    with pytest.raises(ValueError, match="not in the schedule"):
        measured_result("toy", wrong, records)
    with pytest.raises(ValueError, match="no timing on ranks"):
        measured_result("toy", schedule, [records[0] | {"timeline": records[0]["timeline"][:3]}])


def test_measured_trace_is_drawn_from_spans(tmp_path):
    schedule = toy_schedule()
    result = measured_result("toy", schedule, _records(schedule))
    path = tmp_path / "trace.json"
    write_trace(result, str(path))
    events = json.loads(path.read_text())["traceEvents"]
    mbs = [e for e in events if e.get("cat") == "micro_batch"]
    assert len(mbs) == 9 and {e["tid"] for e in mbs} == {0, 1, 2, 3}
    assert len([e for e in events if e["name"] == "grad all-reduce"]) == 8


@pytest.mark.slow
def test_training_stores_the_schedule_it_ran_and_spans_per_step(tmp_path):
    config = small_config(tmp_path, dataset_limit=1, timeline=True, epochs=1)
    train_rank(config)
    schedule = load_schedule(tmp_path, 0)
    records = read_metrics(tmp_path)
    assert len(records) == len(schedule.iterations)
    result = measured_result("run", schedule, records)
    assert result.samples == schedule.samples_scheduled
    assert not (tmp_path / "schedules" / "epoch-0.json.tmp").exists()
