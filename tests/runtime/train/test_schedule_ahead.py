"""The next epoch's schedule is built while the current one trains: after the first
step no step waits for scheduling, and the schedule is the one built in place."""

from __future__ import annotations

import threading

import pytest
import torch
from run_config import small_config

from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.train.data_centric import DataCentric
from datacentric.train.metrics import read_metrics
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_next_epoch_is_scheduled_while_this_one_trains():
    torch.manual_seed(0)
    dataset = StdlibCorpus(max_tokens=256, limit=1)
    model = build_model("llama", hidden_size=32, num_heads=2, ffn_hidden_size=64)
    dc = DataCentric(
        model,
        dataset,
        preset="llama",
        policy="dcp-opt",
        tokens_per_iteration=2048,
        groups=ProcessGroups.local(),
        prefetch=0,
    )
    built: dict[int, str] = {}
    ready = threading.Event()
    schedule = dc.pipeline.schedule

    def spy(epoch=0, **kwargs):
        out = schedule(epoch, **kwargs)
        built[epoch] = threading.current_thread().name
        if epoch == 1:
            ready.set()
        return out

    dc.pipeline.schedule = spy
    waits, epochs, ran = [], [], {}
    for step in dc.steps(epochs=2):
        ran[step.epoch] = dc.current_schedule()
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
        waits.append(step.schedule_wait_s)
        epochs.append(step.epoch)
        if step.epoch == 0 and dc.position.epoch == 1:  # epoch 0's last step is done
            assert ready.wait(120), "the next epoch's schedule was never built"
    first_of_next = epochs.index(1)
    assert first_of_next >= 2, "the test needs epochs of several steps"
    assert built == {0: "MainThread", 1: "schedule-epoch-1"}
    assert waits[0] > 0.0
    assert waits[1:] == [0.0] * (len(waits) - 1)
    # exactly the schedule built in place: a pure function of its inputs
    fresh = schedule(1)
    assert schedule_fingerprint(ran[1]) == schedule_fingerprint(fresh)
    assert ran[1].iterations == fresh.iterations


@pytest.mark.slow
def test_a_two_epoch_run_logs_no_schedule_wait_after_the_first_step(tmp_path):
    config = small_config(tmp_path, dataset_limit=1, epochs=2, tokens_per_iteration=2048)
    train_rank(config)
    records = read_metrics(tmp_path)
    epochs = [r["epoch"] for r in records]
    waits = [r["schedule_wait_s"] for r in records]
    assert set(epochs) == {0, 1} and epochs.index(1) >= 2, epochs
    assert waits[0] > 0.0
    later = [w for k, w in enumerate(waits[1:], start=1) if k != epochs.index(1)]
    assert later == [0.0] * len(later)
    # built while epoch 0 trained: at most what is left of it at the boundary, less
    # than the first step's wait (which also planned the buckets)
    assert waits[epochs.index(1)] < waits[0]


def test_no_schedule_is_built_ahead_for_a_run_that_ends_within_the_epoch():
    model = build_model("llama", hidden_size=32, num_heads=2, ffn_hidden_size=64)
    dc = DataCentric(
        model,
        StdlibCorpus(max_tokens=256, limit=1),
        preset="llama",
        policy="dcp-opt",
        tokens_per_iteration=2048,
        groups=ProcessGroups.local(),
        prefetch=0,
    )
    built = []
    schedule = dc.pipeline.schedule

    def spy(epoch=0, **kwargs):
        built.append(epoch)
        return schedule(epoch, **kwargs)

    dc.pipeline.schedule = spy
    for step in dc.steps(epochs=None, iterations=1):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    assert len(dc.current_schedule().iterations) > 1  # the epoch goes on past the run
    assert built == [0]
