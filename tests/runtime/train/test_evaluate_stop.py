"""A stop signal during ``DataCentric.evaluate`` (the held-out loss, collective) is
agreed by the ranks before each batch: where only one rank is signalled (one node of
several), no rank starts another batch and the loss is ``None`` on every rank (before,
every other rank ran all of its batches first); unsignalled, the loss is the same."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from run_config import small_config

from datacentric.data import SyntheticTextDataset
from datacentric.models import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import launch
from datacentric.shapes import SampleShape
from datacentric.train.data_centric import DataCentric
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.trainer import train_rank
from datacentric.train.validation import held_out

pytestmark = pytest.mark.usefixtures("one_thread")

#: text of mixed lengths, scheduled in several batches of 64 tokens
SHAPES = [SampleShape.text(n) for n in (17, 40, 5, 64, 9, 33, 60, 3, 21, 50)]


def _one_rank_signalled() -> dict:
    """On a rank of 2: the held-out loss with no stop and with a stop never signalled,
    then with rank 0 alone signalled once its first batch is done: the micro-batches
    this rank ran then (model forwards), those it holds of the first batch, and what
    it got."""
    groups = ProcessGroups()
    torch.manual_seed(0)
    dataset = SyntheticTextDataset(SHAPES, seed=7)
    dc = DataCentric(
        build_model("llama"),
        dataset,
        preset="llama",
        groups=groups,
        prefetch=0,
        check_model=False,
        shard="none",
        tokens_per_iteration=64,
    )
    try:
        plain = dc.evaluate(dataset)
        unsignalled = dc.evaluate(dataset, stop=lambda: False)
        iterations = dc.prepare_evaluation(dataset).schedule.iterations
        first = len(list(iterations[0].micro_batches_of_rank(groups.rank)))
        asked: list[int] = []

        def stop() -> bool:  # rank 0's signal, once its first batch is done
            asked.append(1)
            return groups.rank == 0 and len(asked) > 1

        forwards: list[int] = []
        hook = dc.module.register_forward_hook(lambda *a: forwards.append(1))
        stopped = dc.evaluate(dataset, stop=stop)
        hook.remove()
        return {
            "plain": plain,
            "unsignalled": unsignalled,
            "batches": len(iterations),
            "first": first,
            "stopped": stopped,
            "asked": len(asked),
            "forwards": len(forwards),
        }
    finally:
        dc.close()


@pytest.mark.slow
def test_a_rank_not_signalled_starts_no_batch_after_the_stop_is_agreed():
    ranks = launch(_one_rank_signalled, nproc=2, collective_timeout_s=120.0)
    results = [ranks[r] for r in range(2)]
    assert results[0]["batches"] >= 3, results  # batches left to skip
    for r in results:
        assert r["unsignalled"] == r["plain"] == results[0]["plain"]
        assert r["stopped"] is None, r
        assert r["asked"] == 2, r  # before the first batch and the second: no more
    # each rank ran its micro-batches of the first batch alone (before: of every batch)
    assert [r["forwards"] for r in results] == [r["first"] for r in results], results


@pytest.mark.slow
def test_a_sigterm_during_the_held_out_loss_stops_before_its_next_batch(tmp_path, monkeypatch):
    """SIGTERM at the first held-out micro-batch of the validation after step 2 of 4:
    no batch after the first, no ``val_loss`` for step 2, the run saves step 2 and
    stops (before: every batch ran, and the step recorded its loss). Its resume runs
    that validation first: the held-out losses and records are the uninterrupted run's
    (before: step 2's ``val_loss`` was never recorded)."""
    packed: list[int] = []
    batches: list[int] = []
    real = held_out.evaluate_schedule

    def signalled(runtime, iterations, pack, *args, **kwargs):
        batches.append(len(iterations))

        def first_signals(ids, sp):
            packed.append(len(packed) + 1)
            if len(packed) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return pack(ids, sp)

        return real(runtime, iterations, first_signals, *args, **kwargs)

    monkeypatch.setattr(held_out, "evaluate_schedule", signalled)
    settings = dict(validation_dataset="split=0.25", validation_every=2, tokens_per_iteration=256)
    result = train_rank(small_config(tmp_path, iterations=4, **settings))
    assert result.stopped_by_signal == signal.SIGTERM and result.iterations_done == 2
    assert batches == [6], batches  # one micro-batch each, at world 1
    assert packed == [1], packed  # the first batch alone (before: all 6)
    assert result.val_losses == [] and result.checkpoint == "step-00000002"
    assert not any("val_loss" in r for r in read_metrics(tmp_path))
    config = small_config(tmp_path, iterations=4, resume=True, **settings)
    resumed = train_rank(config)
    straight = train_rank(small_config(tmp_path / "straight", iterations=4, **settings))
    assert [s for s, _ in resumed.val_losses] == [2, 4] == [s for s, _ in straight.val_losses]
    torch.testing.assert_close(resumed.val_losses, straight.val_losses, rtol=1e-6, atol=0.0)
    records = [read_metrics(folder) for folder in (tmp_path, tmp_path / "straight")]
    assert [[(r["iteration"], "val_loss" in r) for r in run] for run in records] == [
        [(0, False), (1, True), (2, False), (3, True)]
    ] * 2
