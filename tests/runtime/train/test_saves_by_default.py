"""A run saves by default, by steps and by wall time, so an interruption loses at most
that much; Ctrl-C pressed twice says which checkpoint is kept and which steps are lost;
``--resume`` with nothing saved says so; a resumed run's first line counts the steps it
will take."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from cli_here import cli_here
from run_config import SMALL_TRAIN_FLAGS

from datacentric.settings.sections import CheckpointConfig
from datacentric.train.checkpoints.checkpoint_save import save_checkpoint
from datacentric.train.checkpoints.preemption import SECOND_SIGNAL_AFTER_S
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints
from datacentric.train.checkpoints.run_saves import RunSaves
from datacentric.train.trainer import Trainer, steps_text


def test_a_default_run_saves_every_500_steps_or_10_minutes(tmp_path) -> None:
    checkpoints = RunCheckpoints(CheckpointConfig(), tmp_path)
    assert checkpoints.interval_text() == "every 500 steps or 10 min"
    assert [n for n in range(1, 1501) if checkpoints.due(n)] == [500, 1000, 1500]
    assert not checkpoints.overdue(599.0) and checkpoints.overdue(600.0)
    by_time = RunCheckpoints(CheckpointConfig(checkpoint_every=0), tmp_path)
    assert not by_time.due(500) and by_time.interval_text() == "every 10 min"
    each = CheckpointConfig(checkpoint_every=1, checkpoint_every_minutes=0)
    assert RunCheckpoints(each, tmp_path).interval_text() == "every 1 step"
    never = CheckpointConfig(checkpoint_every=0, checkpoint_every_minutes=0)
    assert not RunCheckpoints(never, tmp_path).overdue(1e9)


def _lost(kept, number: int, finished: bool = False, done: int = 0) -> str:
    """The second Ctrl-C's words for a run that kept ``kept`` while in step ``number``."""
    checkpoints = RunCheckpoints(CheckpointConfig(), Path("run"))
    saves = RunSaves(checkpoints, None, 0, 60.0, say=print, on_saved=print, kept=kept)
    trainer = SimpleNamespace(
        saves=saves,
        _step_now=SimpleNamespace(number=number, finished=finished),
        position=SimpleNamespace(iterations_done=done),
    )
    return Trainer._lost_note(trainer)


def test_the_second_ctrl_c_says_what_is_kept_and_lost(tmp_path) -> None:
    kept = tmp_path / "checkpoints" / "step-00000006"
    assert _lost(None, 1) == (
        "no checkpoint was saved yet (steps 1-2 are lost; the run saves every 500 steps or 10 min)"
    )
    assert _lost(kept, 6) == f"{kept} is kept (step 7 is lost); continue from it with --resume"
    assert _lost(kept, 6, finished=True, done=6).startswith(f"{kept} is kept (no step is lost)")


def _stop_note(step, done: int, read_after: int, total=100, agreeing=False) -> str:
    """The first Ctrl-C's words for a run in ``step`` (None: none run yet) with ``done``
    steps done, the ranks' last agreement on the stop signals after step ``read_after``
    (``agreeing``: they are agreeing now)."""
    trainer = SimpleNamespace(
        _step_now=step,
        position=SimpleNamespace(iterations_done=done),
        _stop_read_after=read_after,
        _stop_agreeing=agreeing,
        total_iterations=total,
    )
    return Trainer._stop_note(trainer, 2)


def test_the_first_ctrl_c_names_the_step_the_run_stops_after() -> None:
    """The ranks agree on the signals after each step: one that comes after they agreed
    after step 30 (in a periodic save, the next step's schedule) stops after 31; one that
    comes while they agree, after 30 if another rank read it in time, else after 31."""
    running, finished = (
        SimpleNamespace(number=30, finished=False),
        SimpleNamespace(number=29, finished=True),
    )
    assert _stop_note(running, 30, 30) == "finishing step 31, then saving"
    assert _stop_note(finished, 30, 29) == "stopping after step 30, then saving"
    assert (
        _stop_note(finished, 30, 29, agreeing=True) == "stopping after step 30 or 31, then saving"
    )
    assert _stop_note(finished, 30, 30) == "stopping after step 31, then saving"
    assert _stop_note(None, 30, -1) == "stopping after step 31, then saving"  # resumed
    assert _stop_note(finished, 100, 100) == "stopping after step 100, then saving"
    assert _stop_note(finished, 100, 99, agreeing=True) == "stopping after step 100, then saving"
    # a stop at start-up, before a checkpoint to resume from is read (no total yet)
    assert _stop_note(None, 0, -1, total=0) == "stopping after the next step, then saving"


def test_resume_with_no_checkpoint_says_so(tmp_path, caplog) -> None:
    (tmp_path / "metrics.jsonl").write_text("")  # a run that stopped before its first save
    checkpoints = RunCheckpoints(CheckpointConfig(resume=True), tmp_path)
    with caplog.at_level(logging.WARNING, logger="datacentric"):
        assert checkpoints.to_load(restarted=False) is None
    assert f"--resume: {tmp_path} holds no checkpoint" in caplog.text
    assert "starting at step 1" in caplog.text
    caplog.clear()
    import torch

    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 2, model, torch.optim.SGD(model.parameters()), {"n": 2})
    with caplog.at_level(logging.WARNING, logger="datacentric"):
        assert checkpoints.to_load(restarted=False) is not None
    assert "holds no checkpoint" not in caplog.text
    caplog.clear()
    (tmp_path / "never-run").mkdir()  # as the first start's lock of the run folder makes it
    never = RunCheckpoints(CheckpointConfig(resume=True), tmp_path / "never-run")
    with caplog.at_level(logging.WARNING, logger="datacentric"):
        assert never.to_load(restarted=False) is None
    said = f"--resume: {tmp_path / 'never-run'} holds no run yet: a new run, at step 1"
    assert said in caplog.text
    assert "stopped before its first save" not in caplog.text  # no run stopped there


def test_steps_text_counts_the_steps_a_resume_takes() -> None:
    assert steps_text(0, 10) == "10 steps"
    assert steps_text(6, 10) == "steps 7-10 of 10 (4 to run)"
    assert steps_text(10, 10) == "all 10 steps done already"


def test_two_ctrl_c_keep_the_last_periodic_checkpoint_and_say_so(tmp_path, capsys) -> None:
    """A run saving every 3 steps hangs in step 5; Ctrl-C twice stops it at once, naming
    step 3's checkpoint as kept and steps 4-5 as lost; ``--resume`` continues from it."""
    out = tmp_path / "run"
    argv = [*SMALL_TRAIN_FLAGS, "--iterations", "7", "--checkpoint-every", "3", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    hang = ["--fault-inject", "0:4:hang", "--collective-timeout-s", "60"]  # in step 5
    run = subprocess.Popen(
        [sys.executable, "-m", "datacentric", "train", *argv, *hang],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    marker, deadline = out / ".fault-injected-rank0-at4", time.monotonic() + 300
    while not marker.exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    run.send_signal(signal.SIGINT)
    time.sleep(SECOND_SIGNAL_AFTER_S + 0.5)
    run.send_signal(signal.SIGINT)
    err = run.communicate(timeout=120)[1]
    assert run.returncode == 128 + signal.SIGINT, err[-3000:]
    kept = out / "checkpoints" / "step-00000003"
    assert "SIGINT: finishing step 5, then saving" in err, err[-3000:]
    said = f"SIGINT again: stopped now, without a save; {kept} is kept (steps 4-5 are lost)"
    assert said in err, err[-3000:]
    status, _, resumed = cli_here(["train", *argv, "--resume"], capsys)
    assert status == 0, resumed[-3000:]
    assert "resuming from step-00000003 at step 3" in resumed
    assert re.search(r"policy \S+: steps 4-7 of 7 \(4 to run\)", resumed), resumed[-3000:]


def test_a_run_saves_once_the_wall_time_interval_has_passed(tmp_path, capsys) -> None:
    """By wall time alone (steps off): every step of this run takes longer than the
    interval (6 ms), so each is saved once, the last one too (no second final save)."""
    out = tmp_path / "run"
    argv = ["train", *SMALL_TRAIN_FLAGS, "--iterations", "3", "--checkpoint-every", "0"]
    argv += ["--checkpoint-every-minutes", "0.0001", "--no-plots", "--out", str(out)]
    status, _, err = cli_here(argv, capsys)
    assert status == 0, err[-3000:]
    saved = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step"))
    assert saved == ["step-00000001", "step-00000002", "step-00000003"], saved
