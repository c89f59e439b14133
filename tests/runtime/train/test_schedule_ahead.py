"""The next epoch's schedule is built while the current one trains (the first epoch's
steps stream: test_streamed_schedule.py): after the first step no step waits for
scheduling (``schedule_wait_s == 0.0`` exactly, in the user loop
and in ``metrics.jsonl``), and the schedule is the one built in place.

The build starts when the epoch before it is taken, so it has that whole epoch's
training to finish in: these tests' epochs train several steps of a model whose step
costs more than a build of these few samples (the build's and the epoch's seconds are
in the failure messages)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from run_config import small_config

from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.train.data_centric import DataCentric
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.schedule_ahead import ScheduleAhead
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


def small_loop(prefetch: int = 0, files: int = 1, tokens: int = 2048) -> DataCentric:
    """A small model on ``files`` corpus files (one: 3 steps an epoch at 2,048 tokens a
    step)."""
    torch.manual_seed(0)
    return DataCentric(
        build_model("llama", hidden_size=64, num_heads=2, ffn_hidden_size=128),
        StdlibCorpus(max_tokens=256, limit=files),
        preset="llama",
        policy="dcp-opt",
        tokens_per_iteration=tokens,
        groups=ProcessGroups.local(),
        prefetch=prefetch,
    )


@pytest.mark.parametrize("prefetch", [2, 0], ids=["prefetch", "no-prefetch"])
def test_the_next_epoch_is_scheduled_while_this_one_trains(prefetch):
    dc = small_loop(prefetch)
    assert (dc.prefetcher is not None) == bool(prefetch)
    built: dict[int, str] = {}
    build_s: dict[int, float] = {}
    schedule = dc.pipeline.schedule

    def spy(epoch=0, **kwargs):
        started = time.perf_counter()
        out = schedule(epoch, **kwargs)
        build_s[epoch] = time.perf_counter() - started
        built[epoch] = threading.current_thread().name
        return out

    dc.pipeline.schedule = spy
    streamed: list[tuple[int, str]] = []
    stream = dc.pipeline.stream

    def stream_spy(epoch=0, **kwargs):
        streamed.append((epoch, threading.current_thread().name))
        return stream(epoch, **kwargs)

    dc.pipeline.stream = stream_spy
    waits, epochs, ran = [], [], {}
    started = time.perf_counter()
    for step in dc.steps(epochs=2):
        ran[step.epoch] = dc.current_schedule()
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
        waits.append(step.schedule_wait_s)
        epochs.append(step.epoch)
        if dc.position.epoch == 1 and step.epoch == 0:
            epoch_0_s = time.perf_counter() - started
    dc.close()
    assert epochs.index(1) >= 2, "the test needs epochs of several steps"
    # the first epoch's steps streamed by the loop, the next epoch built ahead, whole
    assert streamed == [(0, "MainThread"), (1, "schedule-epoch-1")]
    assert built == {1: "schedule-epoch-1"}
    assert waits[0] > 0.0
    assert waits[1:] == [0.0] * (len(waits) - 1), (waits, build_s, epoch_0_s)
    # exactly the schedule built in place: a pure function of its inputs
    fresh = schedule(1)
    assert schedule_fingerprint(ran[1]) == schedule_fingerprint(fresh)
    assert ran[1].iterations == fresh.iterations


@pytest.mark.slow
def test_a_two_epoch_run_logs_no_schedule_wait_after_the_first_step(tmp_path):
    config = small_config(tmp_path, dataset_limit=1, epochs=2, tokens_per_iteration=2048)
    train_rank(config)  # micro-batches prefetched, as by default
    records = read_metrics(tmp_path)
    epochs = [r["epoch"] for r in records]
    waits = [r["schedule_wait_s"] for r in records]
    assert set(epochs) == {0, 1} and epochs.index(1) >= 2, epochs
    assert waits[0] > 0.0  # the first epoch's plan and schedule, built in place
    assert waits[1:] == [0.0] * (len(waits) - 1), (
        waits,
        [r["iteration_time_s"] for r in records],
    )


def test_no_schedule_is_built_ahead_for_a_run_that_ends_within_the_epoch():
    dc = small_loop()
    built = []
    schedule = dc.pipeline.schedule

    def spy(epoch=0, **kwargs):
        built.append(epoch)
        return schedule(epoch, **kwargs)

    dc.pipeline.schedule = spy
    stream = dc.pipeline.stream
    dc.pipeline.stream = lambda epoch=0, **kwargs: built.append(epoch) or stream(epoch, **kwargs)
    for step in dc.steps(epochs=None, iterations=1):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    assert len(dc.current_schedule().iterations) > 1  # the epoch goes on past the run
    assert built == [0]


def test_a_build_counts_only_real_waiting_and_never_serves_another_epoch():
    gates = {epoch: threading.Event() for epoch in (1, 2, 3)}

    def make(epoch):  # a stand-in schedule: which epoch built it
        assert gates[epoch].wait(10)
        if epoch == 3:
            raise ValueError("epoch 3 fits no configuration")
        return f"schedule of epoch {epoch}"

    ahead = ScheduleAhead(make)
    assert ahead.take(1) is None  # nothing started
    ahead.start(1)
    ahead.start(2)  # epoch 1's build is forgotten, even when it finishes later
    gates[1].set()
    threading.Timer(0.2, gates[2].set).start()
    schedule, waited = ahead.take(2)
    assert schedule == "schedule of epoch 2"
    assert 0.1 < waited < 10  # it was still running: the wait is what the caller waited
    assert ahead.take(2) is None  # taken once
    gates[3].set()
    ahead.start(3)
    ahead._build.done.wait(10)
    with pytest.raises(ValueError, match="epoch 3 fits no configuration"):
        ahead.take(3)  # raised where the schedule is taken
    gates[2].clear()
    ahead.start(2)
    gates[2].set()
    ahead._build.done.wait(10)
    assert ahead.take(2) == ("schedule of epoch 2", 0.0)  # ready: 0.0 exactly


def test_each_epoch_of_one_step_announces_its_schedule():
    """An epoch whose schedule is whole only once its last step is handed out (one step
    an epoch here; a resume one step before an epoch's end on another world) is still
    announced (``schedules/epoch-N.json``) when the next epoch begins: before, its
    build was cancelled there unheard, and only the last epoch's schedule was saved."""
    dc = small_loop(tokens=8192)  # the whole corpus file in one step
    heard: list[tuple[int, int]] = []
    for step in dc.steps(
        epochs=3, on_schedule=lambda s, at: heard.append((s.epoch, len(s.iterations)))
    ):
        for micro in step:
            micro.backward(dc.model(micro.batch))
        step.finish()
    dc.close()
    assert dc.position.iterations_done == 3
    assert heard == [(0, 1), (1, 1), (2, 1)], heard
