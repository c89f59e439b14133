"""A stop request is one request however often it arrives: a repeated SIGTERM (a
cluster signals every process of the job, and the launcher forwards it again; a rank
busy in one long operation runs both handlers late, together) never cuts the save
short; only Ctrl-C pressed again does, and says so. A save cut short by a kill is named
when the run resumes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from repo_paths import ROOT
from run_config import SMALL_TRAIN_FLAGS

from datacentric.parallel.launch import spawn
from datacentric.settings.sections import CheckpointConfig
from datacentric.train.checkpoints import checkpoint as ckpt
from datacentric.train.checkpoints.preemption import (
    SECOND_SIGNAL_AFTER_S,
    StoppedWhileStarting,
    StopSignals,
)
from datacentric.train.checkpoints.run_checkpoints import RunCheckpoints

HERE = Path(__file__).parent


def _python(script: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    path = os.pathsep.join(str(p) for p in (HERE, ROOT / "tests", ROOT))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


#: Two SIGTERMs far apart, a Ctrl-C relayed by the launcher, then a SIGINT: the process
#: must survive the second SIGTERM and the relay (it is saving) and end, saying so, at the
#: SIGINT.
ONE_PROCESS = """
    import os, signal, time
    from datacentric.parallel.launch import RELAYED_SIGINT
    from datacentric.train.checkpoints.preemption import SECOND_SIGNAL_AFTER_S, StopSignals
    with StopSignals(lambda signum: "finishing step 4, then saving") as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(SECOND_SIGNAL_AFTER_S + 0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("still saving after a second SIGTERM", stop.signum, flush=True)
        os.kill(os.getpid(), RELAYED_SIGINT)
        time.sleep(0.2)
        print("a relayed Ctrl-C is never Ctrl-C again", stop.signum, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("a SIGINT after a SIGTERM far apart is Ctrl-C again", flush=True)
"""


def test_a_repeated_sigterm_never_cuts_the_save_short() -> None:
    done = _python(ONE_PROCESS)
    out, err = done.communicate(timeout=120)
    saving = ["still saving after a second SIGTERM 15", "a relayed Ctrl-C is never Ctrl-C again 15"]
    assert out.splitlines() == saving, out + err
    assert done.returncode == 128 + signal.SIGINT, err
    assert "SIGTERM: finishing step 4, then saving" in err
    assert err.strip().endswith("SIGINT again: stopped now, without a save"), err


def saving_rank(folder: str) -> int:
    """A rank that, once signalled, takes 3 s to "save" and returns the signal."""
    import torch.distributed as dist

    with StopSignals() as stop:
        Path(folder, f"ready-{dist.get_rank()}").touch()
        while stop.signum is None:
            time.sleep(0.05)
        end = time.monotonic() + 3
        while time.monotonic() < end:  # busy, as a save is
            torch.ones(64, 64) @ torch.ones(64, 64)
        return stop.signum


LAUNCHER = """
    import sys
    from datacentric.parallel.launch import spawn
    from test_preemption_signals import saving_rank
    print("results", spawn(saving_rank, 2, sys.argv[1], forward_signals=True, timeout_s=300))
"""


@pytest.mark.slow
def test_the_launcher_and_its_ranks_treat_a_repeated_sigterm_as_one(tmp_path) -> None:
    launcher = _python(LAUNCHER, str(tmp_path), start_new_session=True)
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("ready-*"))) < 2:  # both ranks are in their handler
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    os.killpg(launcher.pid, signal.SIGTERM)  # as a cluster: every process of the job
    time.sleep(SECOND_SIGNAL_AFTER_S + 0.5)
    os.killpg(launcher.pid, signal.SIGTERM)  # and again, while the ranks "save"
    out, err = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, (out, err[-3000:])
    assert "results [15, 15]" in out, out + err[-2000:]


def test_a_save_cut_short_is_named_on_resume(tmp_path, caplog) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    kept = ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
    (tmp_path / "checkpoints" / "step-00000004.tmp").mkdir()  # killed while saving step 4
    checkpoints = RunCheckpoints(CheckpointConfig(resume=True), tmp_path)
    with caplog.at_level(logging.WARNING, logger="datacentric"):
        assert checkpoints.to_load(restarted=False) == kept
    assert "the save of step 4 was cut short" in caplog.text
    assert f"resuming from {kept.name}" in caplog.text


def stopping_rank(folder: str) -> None:
    """A rank that, once signalled, "saves" until stopped; rank 0 says what is kept."""
    import torch.distributed as dist

    rank = dist.get_rank()
    announce = (lambda signum: "finishing step 5, then saving") if rank == 0 else None
    with StopSignals(announce, lambda: "step-3 is kept (steps 4-5 are lost)") as stop:
        Path(folder, f"ready-{rank}").touch()
        while True:
            time.sleep(0.05 if stop.signum is None else 1.0)


RELAY = """
    import sys
    from datacentric.parallel.launch import spawn
    from test_preemption_signals import stopping_rank
    spawn(stopping_rank, 2, sys.argv[1], forward_signals=True, timeout_s=300)
"""


@pytest.mark.slow
def test_ctrl_c_again_relayed_by_the_launcher_says_what_is_kept(tmp_path) -> None:
    """Only the launcher is signalled (as a scheduler's relay): the first SIGINT reaches
    the ranks as a stop they name SIGINT (the user's Ctrl-C, not the launcher's relay),
    the second as Ctrl-C again, before they are killed."""
    launcher = _python(RELAY, str(tmp_path))
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)
    time.sleep(SECOND_SIGNAL_AFTER_S + 0.5)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode != 0, err[-2000:]
    assert "SIGINT: finishing step 5, then saving" in err, err[-2000:]
    assert "SIGTERM" not in err, err[-2000:]
    again = "SIGINT again: stopped now, without a save; step-3 is kept (steps 4-5 are lost)"
    assert again in err, err[-2000:]


def rank_that_never_starts(folder: str) -> None:
    """A rank's work; a stop that reached the ranks while they started means it never runs."""
    Path(folder, "ran").touch()


#: The launcher gets a Ctrl-C right after it starts its first rank, so that rank gets the
#: relayed stop while it is still starting (before any run's handler is in place).
STOPPED_STARTING = """
    import os, signal, sys
    from datacentric.parallel import launch
    from test_preemption_signals import rank_that_never_starts
    start = launch._start_rank
    def start_then_ctrl_c(context, rank, *args, **kwargs):
        process = start(context, rank, *args, **kwargs)
        if rank == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return process
    launch._start_rank = start_then_ctrl_c
    launch.spawn(rank_that_never_starts, 2, sys.argv[1], forward_signals=True, timeout_s=120)
"""


def test_a_ctrl_c_while_the_ranks_start_stops_them_cleanly(tmp_path) -> None:
    launcher = _python(STOPPED_STARTING, str(tmp_path))
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signal.SIGINT, err[-3000:]
    stop = "stopped by SIGINT while the ranks were starting; nothing saved yet; start again"
    assert stop in err, err[-3000:]
    assert "Traceback" not in err and "-10" not in err, err[-3000:]
    assert not (tmp_path / "ran").exists()


def test_a_sigterm_while_the_ranks_start_stops_them_cleanly(tmp_path, monkeypatch, capsys) -> None:
    """A scheduler's SIGTERM reaches a rank as it starts (every process of the job gets it,
    and the launcher passes its own on): held until the rank can take it, it ends the
    ranks before their work as a Ctrl-C does, in one line, with 143."""
    from datacentric.parallel import launch

    start = launch._start_rank

    def start_then_sigterm(context, rank, *args, **kwargs):
        process = start(context, rank, *args, **kwargs)
        if rank == 0:
            os.kill(process.pid, signal.SIGTERM)
        return process

    monkeypatch.setattr(launch, "_start_rank", start_then_sigterm)
    with pytest.raises(SystemExit) as end:
        spawn(rank_that_never_starts, 2, str(tmp_path), forward_signals=True, timeout_s=120)
    assert end.value.code == 128 + signal.SIGTERM
    stop = "datacentric: stopped by SIGTERM while the ranks were starting; nothing saved yet"
    assert capsys.readouterr().err.startswith(stop)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_relayed_while_the_run_starts_is_taken_over_by_its_handler(monkeypatch, sig) -> None:
    """Relayed after the ranks agreed to start, before the run's handler is in place: the
    run takes it as its first stop signal (it stops after a step and saves), named as the
    launcher got it."""
    from datacentric.parallel import start_stops

    said: list[int] = []
    monkeypatch.setattr(start_stops, "_STARTING", start_stops._StartStop())
    with StopSignals(lambda signum: said.append(signum) or "stopping after step 1") as stop:
        assert stop.signum is None
    relayed = start_stops.RELAYED_SIGINT if sig == signal.SIGINT else sig
    start_stops._STARTING.handle(relayed, None)
    with StopSignals(lambda signum: said.append(signum) or "stopping after step 1") as stop:
        assert stop.signum == sig
    assert said == [sig]


def rank_signalled_before_its_handler() -> tuple[int | None, list[int]]:
    """A run that gets a SIGTERM after it began, before its stop handler is in place."""
    os.kill(os.getpid(), signal.SIGTERM)
    said: list[int] = []
    with StopSignals(lambda signum: said.append(signum) or "stopping after step 1") as stop:
        return stop.signum, said


def test_a_sigterm_before_the_run_s_handler_is_taken_over_by_it() -> None:
    """Forwarded stops (a training launch): the run stops on it as on a later SIGTERM and
    names it; not forwarded, a SIGTERM still ends the rank at once."""
    stopped = spawn(rank_signalled_before_its_handler, 2, forward_signals=True, timeout_s=120)
    assert stopped == [(signal.SIGTERM, [signal.SIGTERM])] * 2
    with pytest.raises(RuntimeError, match="exited with code -15"):
        spawn(rank_signalled_before_its_handler, 2, timeout_s=120)


#: ``python -m datacentric train`` as torchrun starts a rank (its environment, a world of
#: one); the signal comes right after the process group, while the rank is still starting.
TORCHRUN_RANK = """
    import os, signal, sys
    from datacentric.cli.main import main
    from datacentric.parallel import launch
    init = launch.init_from_env
    def init_then_stop(*args, **kwargs):
        groups = init(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        return groups
    launch.init_from_env = init_then_stop
    sys.exit(main(["train", *sys.argv[2:]]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_a_torchrun_rank_starts_ends_it_in_one_line(tmp_path, sig) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torchrun = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    torchrun.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    flags = [*SMALL_TRAIN_FLAGS, "--iterations", "2", "--out", str(tmp_path / "run")]
    rank = _python(TORCHRUN_RANK, sig.name, *flags, env=torchrun)
    _, err = rank.communicate(timeout=120)
    assert rank.returncode == 128 + sig, err[-3000:]
    stop = (
        f"datacentric train: stopped by {sig.name} while rank 0 was starting; nothing saved "
        "yet; start again with the same command"
    )
    assert stop in err.splitlines(), err[-3000:]
    assert "Traceback" not in err and "interrupted" not in err, err[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_run_takes_the_signals_over_from_the_start_up() -> None:
    """Once the run's handler is in place a stop is its own (stop after a step, save),
    and when it ends the signals are handled as before the start-up."""
    before = signal.getsignal(signal.SIGINT)
    with StoppedWhileStarting(0):
        assert signal.getsignal(signal.SIGINT) != before
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            assert stop.signum == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGINT) is before
