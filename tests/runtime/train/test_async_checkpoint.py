"""``[checkpoint] async_save``: periodic checkpoints written in the background by
``torch.distributed.checkpoint.async_save``; the manifest only once the save completed,
and a resume from one is bitwise the uninterrupted run, as a resume from a
synchronous save is."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from run_config import small_config

from datacentric.cli.inspect import inspect_run
from datacentric.parallel.launch import spawn
from datacentric.train.checkpoints.checkpoint_folders import MANIFEST
from datacentric.train.checkpoints.checkpoint_load import load_checkpoint
from datacentric.train.checkpoints.checkpoint_save import start_checkpoint
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint, verify_checkpoint
from datacentric.train.trainer import train_rank


def test_an_async_save_holds_the_state_it_started_with_and_commits_on_wait(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    pending = start_checkpoint(tmp_path, 1, model, optimizer, {"step": 1}, async_save=True)
    assert pending.written is not None
    assert latest_checkpoint(tmp_path) is None  # nothing a reader sees before it completes
    assert not (pending.tmp / MANIFEST).exists()
    with torch.no_grad():  # training goes on while the shards are written
        for p in model.parameters():
            p.add_(1.0)
    final = pending.wait()
    assert (final / MANIFEST).exists() and latest_checkpoint(tmp_path) == final
    assert verify_checkpoint(final) == {"step": 1}
    fresh = torch.nn.Linear(8, 4)
    load_checkpoint(final, fresh, torch.optim.AdamW(fresh.parameters()))
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, saved[name]), name


@pytest.mark.slow
def test_async_save_then_resume_equals_the_uninterrupted_run_bitwise(tmp_path, straight):
    """A run saving asynchronously crashes in step 5 (rank 0) after the checkpoint of
    step 3 and resumes: it ends bitwise where the uninterrupted run ends (``straight``,
    shared with test_train_reliability), as a resume from a synchronous save does."""
    config = small_config(tmp_path / "async", iterations=6, checkpoint_every=3, async_save=True)
    assert config.checkpoint.async_save is True
    crashed = dataclasses.replace(
        config, training=dataclasses.replace(config.training, fault_inject="0:4")
    )
    with pytest.raises(RuntimeError, match=r"rank \d"):
        spawn(train_rank, 2, crashed, timeout_s=600)
    assert inspect_run(config.job.out)["iterations_done"] == 3
    resumed = dataclasses.replace(crashed.checkpoint, resume=True)
    spawn(train_rank, 2, dataclasses.replace(crashed, checkpoint=resumed), timeout_s=600)
    want, got = inspect_run(straight.job.out), inspect_run(config.job.out)
    assert want["iterations_done"] == got["iterations_done"] == 6
    assert want["weights_sha256"] == got["weights_sha256"]
    assert want["samples_seen"] == got["samples_seen"]
