"""Reliability of training runs: exact resume, elastic resume, crashed and hung ranks,
non-finite losses, and bad input. Multi-process tests use gloo on local ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from run_config import SMALL_TRAIN_FLAGS, small_config

from datacentric.cli.inspect import inspect_run
from datacentric.data.stdlib import StdlibCorpus
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.planning.hardware import gib_to_bytes
from datacentric.planning.planner import UnfittableBucketError
from datacentric.scheduling.pipeline import Pipeline
from datacentric.shapes import SampleShape, read_lengths_file
from datacentric.train.build import build_cost_model
from datacentric.train.checkpoints.checkpoint_verify import latest_checkpoint, verify_checkpoint
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.run_folder import LOCK_FILE
from datacentric.train.trainer import NonFiniteLossError, train_rank

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def logged_samples(out: Path) -> list[dict]:
    path = out / "samples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def epoch_ids(out: Path, epoch: int = 0) -> Counter:
    return Counter(i for r in logged_samples(out) if r["epoch"] == epoch for i in r["sample_ids"])


def test_resume_after_a_crash_is_bitwise_identical(straight, tmp_path):
    crashed = straight.updated(
        job={"out": str(tmp_path / "crashed")}, training={"fault_inject": "0:3"}
    )
    with pytest.raises(RuntimeError, match=r"rank \d"):
        spawn(train_rank, 2, crashed, timeout_s=600)
    assert inspect_run(crashed.job.out)["iterations_done"] == 3
    spawn(train_rank, 2, crashed.updated(checkpoint={"resume": True}), timeout_s=600)
    a, b = inspect_run(straight.job.out), inspect_run(crashed.job.out)
    assert a["iterations_done"] == b["iterations_done"] == 6
    assert a["samples_seen"] == b["samples_seen"]
    assert a["weights_sha256"] == b["weights_sha256"]
    assert logged_samples(Path(straight.job.out)) == logged_samples(Path(crashed.job.out))


def test_elastic_resume_on_fewer_ranks_runs_every_sample_once(straight, tmp_path):
    """Crashed on 4 ranks in step 4 (saved after 3), resumed on 2: every sample runs once
    in the epoch, each step trains the uninterrupted world-2 run's global batch, and the
    losses are its own (within the accumulation order's noise). Before, the samples the
    4-rank run left were re-planned into other steps (step 5's loss 4.03 against 3.97 in
    a one-rank run)."""
    out = tmp_path / "elastic"
    crashed = straight.updated(job={"out": str(out)}, training={"fault_inject": "0:4"})
    with pytest.raises(RuntimeError, match=r"rank \d"):
        spawn(train_rank, 4, crashed, timeout_s=600)
    assert inspect_run(str(out))["world_size"] == 4
    spawn(train_rank, 2, crashed.updated(checkpoint={"resume": True}), timeout_s=600)
    info = inspect_run(str(out))
    assert info["world_size"] == 2 and info["epoch"] == 1
    counts = epoch_ids(out)
    assert set(counts) == set(range(len(StdlibCorpus(max_tokens=256, limit=2))))
    assert max(counts.values()) == 1
    assert info["samples_seen"] == sum(counts.values())
    runs = [Path(straight.job.out), out]
    steps = [[sorted(r["sample_ids"]) for r in logged_samples(run)] for run in runs]
    assert len(steps[0]) == 6 and steps[0] == steps[1]
    losses = [torch.tensor([r["loss"] for r in read_metrics(run)]) for run in runs]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0.0)
    # the schedule the 4 ranks ran stays; the 2 ranks' one is saved apart, from step 3
    for name, world in (("epoch-0.json", 4), ("epoch-0-step-3.json", 2)):
        assert json.loads((out / "schedules" / name).read_text())["world_size"] == world


def shrink_default_batch(setattr) -> None:
    """Make a small dataset train the default global batch as a large one does: no batch
    sized from the data, and a default of ``world * max(1,024, longest)`` tokens (the
    rule of ``world * max(2**18, longest)``, which grows with the world as it does)."""
    from datacentric.scheduling import global_batches, resume

    def default(view, active, world_size):
        return world_size * max(1024, int(view.tokens[active].max()))

    setattr(global_batches, "data_sized_tokens", lambda tokens: None)
    setattr(global_batches, "default_tokens_per_iteration", default)
    setattr(resume, "default_tokens_per_iteration", default)


def default_batch_rank(config, state: dict | None = None):
    """:func:`train_rank` with :func:`shrink_default_batch` (a spawned rank's own); with
    ``state``, then a user's loop on the same ranks loaded from it
    (:func:`resumed_user_loop`)."""
    shrink_default_batch(setattr)
    result = train_rank(config)
    return result if state is None else resumed_user_loop(config, state)


def user_loop(config, **overrides):
    """A user's ``DataCentric`` loop on ``config``'s model and data, its ``[scheduling]``
    section updated by ``overrides`` (this process's world)."""
    from datacentric.models.presets import build_model
    from datacentric.train.data_centric import DataCentric

    torch.manual_seed(0)
    return DataCentric(
        build_model("llama", hidden_size=64, num_heads=2, ffn_hidden_size=128),
        StdlibCorpus(max_tokens=256, limit=2),
        preset="llama",
        options=config.scheduling.updated(**overrides),
        seed=config.job.seed,
        prefetch=0,
        check_model=False,
        shard="none",
    )


def resumed_user_loop(config, state: dict) -> tuple[int | None, list[int]]:
    """The global batch a user's loop given none trains once loaded from ``state``
    (``dc.load_state_dict``), and the samples of its next step."""
    dc = user_loop(config)
    dc.load_state_dict(state)
    step = dc.current_schedule().iterations[dc.position.segment_iteration]
    tokens = dc.pipeline.options.global_batch_tokens
    dc.close()
    return tokens, sorted(int(i) for i in step.sample_ids())


def test_an_elastic_resume_keeps_the_default_global_batch_of_its_run(tmp_path, monkeypatch):
    """A run given no global batch, stopped on 1 rank after step 2 and resumed on 2,
    trains the steps and losses of the uninterrupted 1-rank run: its checkpoint records
    the default batch it chose, which the resume keeps (and says so) although 2 ranks
    default to twice as many tokens; so does a user's loop on 2 ranks loaded from the
    checkpoint's position (``dc.load_state_dict``), and one giving another batch is
    refused. Before, the rest of the epoch was cut into the
    2-rank default's batches (step 3 trained other samples). A resume giving that batch
    resumes; one giving another is refused naming both; an older record (none) compares
    the setting as typed, as before."""
    from test_resumed_stream import TermAfter

    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.resume import check_unchanged, global_batch_to_train
    from datacentric.train.trainer import Trainer

    shrink_default_batch(monkeypatch.setattr)
    settings = dict(iterations=4, tokens_per_iteration=None)
    train_rank(small_config(tmp_path / "straight", **settings))
    out = tmp_path / "elastic"
    Trainer(small_config(out, **settings), hooks=TermAfter(2)).run()
    path = out / "checkpoints" / "step-00000002"
    saved = json.loads((path / "trainer.json").read_text())
    assert saved["global_batch_tokens"] == 1024  # the default on 1 rank; the settings give none
    assert saved["config"]["scheduling"]["global_batch_tokens"] is None
    resumed = small_config(out, resume=True, **settings)  # as the check before the ranks
    shapes = StdlibCorpus(max_tokens=256, limit=2).shapes()
    sections = (resumed.scheduling, resumed.training, resumed.job, resumed.checkpoint)
    kept = global_batch_to_train(*sections, shapes, [1, 2], 2)
    assert kept.tokens == 1024 and "kept at 1,024 tokens" in kept.note, kept
    assert "2 ranks would default to 2,048" in kept.note, kept

    def given(tokens: int) -> dict:
        return small_config(out, **{**settings, "tokens_per_iteration": tokens}).to_json()

    fingerprint = saved["dataset_fingerprint"]
    check_unchanged(path, saved, given(1024), fingerprint)  # the batch it trained
    check_unchanged(path, saved, small_config(out, **settings).to_json(), fingerprint)  # kept
    with pytest.raises(CheckpointError, match=r"global_batch_tokens \(1024 -> 2048\)"):
        check_unchanged(path, saved, given(2048), fingerprint)
    older = {k: v for k, v in saved.items() if k != "global_batch_tokens"}
    with pytest.raises(CheckpointError, match=r"global_batch_tokens \(None -> 1024\)"):
        check_unchanged(path, older, given(1024), fingerprint)
    assert saved["position"]["global_batch_tokens"] == 1024  # dc.state_dict()'s own
    other = user_loop(resumed, global_batch_tokens=2048)  # a user's loop giving another
    with pytest.raises(ValueError, match=r"^DataCentric: .* 1,024 tokens.* gives 2,048 tokens"):
        other.load_state_dict(saved["position"])
    other.close()
    loops = spawn(default_batch_rank, 2, resumed, saved["position"], timeout_s=600)
    assert inspect_run(str(out))["world_size"] == 2
    runs = [tmp_path / "straight", out]
    steps = [[sorted(r["sample_ids"]) for r in logged_samples(run)] for run in runs]
    assert len(steps[0]) == 4 and steps[0] == steps[1]
    assert loops == [(1024, steps[0][2])] * 2  # a user's loop on 2 ranks: step 3, kept batch
    losses = [torch.tensor([r["loss"] for r in read_metrics(run)]) for run in runs]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0.0)


def test_torchrun_restarts_a_killed_rank_and_loses_no_sample(tmp_path):
    out = tmp_path / "torchrun"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "-m",
        "datacentric",
        "train",
        *SMALL_TRAIN_FLAGS,
        "--checkpoint-every",
        "1",
        "--fault-inject",
        "1:2",
        "--out",
        str(out),
        "--json",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / ".fault-injected-rank1-at2").exists()
    counts = epoch_ids(out)
    assert set(counts) == set(range(len(StdlibCorpus(max_tokens=256, limit=2))))
    assert max(counts.values()) == 1


def test_a_hung_rank_times_out_with_rank_and_operation_named(tmp_path):
    config = small_config(
        tmp_path / "hang", iterations=3, collective_timeout_s=15.0, fault_inject="1:1:hang"
    )
    with pytest.raises(RuntimeError) as err:
        spawn(train_rank, 2, config, timeout_s=300, collective_timeout_s=15.0)
    text = str(err.value)
    assert "rank 0: iteration 1 timed out in" in text, text[-2000:]
    first = text.splitlines()[0]  # the collective (FSDP2 is the default) and the peer
    assert "FSDP" in first and "rank 1 is alive in step 1: micro-batch" in first, first


def test_non_finite_loss_stops_and_keeps_the_checkpoint(tmp_path):
    config = small_config(
        tmp_path / "nan",
        iterations=4,
        lr=1e30,
        grad_clip=0.0,
        warmup_iterations=0,
        lr_schedule="constant",
        checkpoint_every=1,
    )
    with pytest.raises(NonFiniteLossError, match=r"iteration \d+ \(epoch \d+\): loss is") as err:
        train_rank(config, ProcessGroups.local())
    assert "samples [" in str(err.value)
    latest = latest_checkpoint(config.job.out)
    assert latest is not None
    state = verify_checkpoint(latest)
    failed_at = int(str(err.value).split("iteration ")[1].split(" ")[0])
    assert state["iterations_done"] == failed_at


def test_bad_input_gets_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no non-empty .py files"):
        StdlibCorpus(limit=0)
    with pytest.raises(ValueError, match="at least one token"):
        SampleShape.text(0)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("12\n0\n")
    with pytest.raises(ValueError, match="at least one token"):
        read_lengths_file(str(lengths))
    lengths.write_text("# nothing\n")
    with pytest.raises(ValueError, match="empty"):
        read_lengths_file(str(lengths))
    shapes = [SampleShape.text(n) for n in (100, 200, 4096)]
    cost = build_cost_model("llama", torch.device("cpu"))
    with pytest.raises(UnfittableBucketError, match=r"bucket 't<=4096' does not fit"):
        _ = Pipeline(shapes, cost, world_size=2, memory_cap_bytes=gib_to_bytes(0.05)).plan


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "datacentric", "train", *SMALL_TRAIN_FLAGS, *args]


def test_two_resumes_at_once_one_runs_the_other_names_the_holder(tmp_path, capsys):
    from test_reliability_cases import errors_only, run_cli

    out = tmp_path / "run"
    argv = ["--resume", "--epochs", "2", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(_cli(*argv), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)  # fmt: skip
    lock = out / LOCK_FILE
    deadline = time.monotonic() + 300
    while "pid" not in (lock.read_text() if lock.exists() else ""):
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGSTOP)  # holds the lock while the second one starts
    try:
        status, err = run_cli(["train", *SMALL_TRAIN_FLAGS, *argv], capsys)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert status == 2 and len(errors_only(err)) == 1, err
    assert f"pid {first.pid}" in errors_only(err)[0] and "another run" in errors_only(err)[0]
    assert first.wait(timeout=300) == 0, first.stderr.read().decode()[-2000:]
    every = set(range(len(StdlibCorpus(max_tokens=256, limit=2))))
    for epoch in (0, 1):
        counts = epoch_ids(out, epoch)
        assert set(counts) == every and max(counts.values()) == 1, (epoch, counts)
    assert not lock.exists()


def test_sigterm_saves_and_the_resume_is_bitwise_identical(straight, tmp_path, capsys):
    from test_reliability_cases import run_cli

    out = tmp_path / "preempted"
    argv = ["--world", "2", "--iterations", "6", "--checkpoint-every", "100", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    stopped = subprocess.run(
        _cli(*argv, "--fault-inject", "0:3:term"),  # rank 0 signals the job in step 3
        env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 4" in stopped.stderr
    assert "datacentric train: SIGTERM: finishing step 4, then saving" in stopped.stderr
    assert inspect_run(str(out))["iterations_done"] == 4
    # the resume in this process (its ranks are fresh processes): only the stop needs a job
    status, err = run_cli(["train", *SMALL_TRAIN_FLAGS, *argv, "--resume"], capsys)
    assert status == 0, err[-30:]
    a, b = inspect_run(straight.job.out), inspect_run(str(out))
    assert a["iterations_done"] == b["iterations_done"] == 6
    assert a["weights_sha256"] == b["weights_sha256"]
    assert logged_samples(Path(straight.job.out)) == logged_samples(out)


def test_a_rank_stopped_inside_a_checkpoint_save_is_named(tmp_path, capsys):
    from test_reliability_cases import errors_only, run_cli

    argv = ["train", *SMALL_TRAIN_FLAGS, "--world", "2", "--iterations", "2"]
    argv += ["--checkpoint-every", "1", "--collective-timeout-s", "10"]
    argv += ["--fault-inject", "1:1:stop", "--out", str(tmp_path / "run")]
    status, err = run_cli(argv, capsys)
    lines = errors_only([ln for ln in err if "saved" not in ln])
    assert status == 2 and len(lines) == 1, err
    assert "rank 1 stopped answering during checkpoint save (step 1)" in lines[0], lines
