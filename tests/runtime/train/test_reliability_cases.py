"""Bad input and faults of ``train`` and ``inspect``: each case gets one line naming the
setting or file, exit status 2, and leaves earlier data unchanged (docs/reliability.md)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_config import SMALL_TRAIN_FLAGS, small_config

from datacentric.cli.main import main
from datacentric.settings import load_config
from datacentric.train.checkpoints import checkpoint as ckpt
from datacentric.train.checkpoints import checkpoint_save
from datacentric.train.lr_schedule import lr_lambda
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = SMALL_TRAIN_FLAGS


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``datacentric ARGV`` in this process: (exit status, stderr lines)."""
    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    return status, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def errors_only(lines: list[str]) -> list[str]:
    return [ln for ln in lines if "note:" not in ln]


BAD_SETTINGS = [
    (["--lr", "fast"], "lr"),
    (["--grad-clip", "-1"], "grad_clip"),
    (["--nproc", "0"], "world"),
    (["--nproc", "-2"], "world"),
    (["--world", "0"], "world"),
    (["--checkpoint-every", "-1"], "checkpoint_every"),
    (["--collective-timeout-s", "0"], "collective_timeout_s"),
    (["--warmup-iterations", "-3"], "warmup_iterations"),
    (["--epochs", "0"], "epochs"),
    (["--iterations", "0"], "iterations"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--dataset-limit", "0"], "dataset_limit"),
    (["--keep-last", "0"], "keep_last"),
    (["--memory-gb", "-1"], "memory_gb"),
    (["--weight-decay", "-0.1"], "weight_decay"),
    (["--policy", "fastest"], "policy"),
    (["--lr-schedule", "exponential"], "lr_schedule"),
    (["--dtype", "float8"], "dtype"),
    (["--fault-inject", "soon"], "fault_inject"),
    (["--scheduling.max_accumulation", "0"], "accumulation"),
    (["--profiling.repeats", "0"], "repeats"),
    (["--profiling.warmup", "1"], "warmup"),
    (["--scheduling.global_batch_tokens", "0"], "global_batch_tokens"),
    (["--training.lrr", "1"], "--training.lrr"),
    (["--config", "no-such-file.toml"], "no-such-file.toml"),
    (["--overwrite", "--resume"], "job.overwrite and checkpoint.resume cannot both be set"),
    (["--overwrite", "--resume-from", "3"], "checkpoint.resume_from"),
    (["--lr-horizon", "longest"], "lr_horizon"),
]


@pytest.mark.parametrize(("argv", "named"), BAD_SETTINGS)
def test_bad_setting_is_one_line_naming_it(argv, named, tmp_path, capsys):
    status, err = run_cli(["train", "--out", str(tmp_path / "run"), *argv], capsys)
    assert status == 2
    assert len(errors_only(err)) == 1 and named in errors_only(err)[0], err
    assert errors_only(err)[0].startswith("datacentric train: ")
    assert not (tmp_path / "run").exists()


BAD_FILES = [
    ('[training]\nlr = "fast"\n', "training.lr"),
    ("[trainig]\nlr = 0.1\n", "trainig"),
    ("[training]\nlrr = 0.1\n", "training.lrr"),
    ("[training]\nseed = 1\n", "[job]"),
    ("learning_rate = 0.1\n[training]\nlr = 0.1\n", "learning_rate"),
    ("[checkpoint]\nkeep_last = -1\n", "checkpoint.keep_last"),
    ("[parallelism]\nworld = 1.5\n", "parallelism.world"),
    ("[training]\nbetas = [0.9]\n", "training.betas"),
    ("[training\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "named"), BAD_FILES)
def test_bad_config_file_is_one_line_naming_the_key(text, named, tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(text)
    status, err = run_cli(["config", "--show", "--config", str(path)], capsys)
    assert status == 2 and len(err) == 1 and named in err[0], err


def test_a_config_that_is_no_toml_file_is_named(tmp_path, capsys):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00lr = 1\n")
    for path, named in ((binary, "not a text TOML file"), (tmp_path, "is a folder")):
        status, err = run_cli(
            ["train", "--config", str(path), "--out", str(tmp_path / "r")], capsys
        )
        assert status == 2 and len(err) == 1 and str(path) in err[0] and named in err[0], err


def test_an_out_that_is_a_file_is_named(tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    status, err = run_cli(["train", *TINY, "--out", str(out)], capsys)
    assert status == 2 and err == [
        f"datacentric train: --out {out} is a file; name a folder for the run"
    ]
    assert out.read_text() == "mine"


def test_inspect_failures_are_one_line(tmp_path, capsys):
    status, err = run_cli(["inspect", str(tmp_path / "missing")], capsys)
    assert status == 2 and len(err) == 1 and "missing" in err[0]
    status, err = run_cli(["inspect", str(tmp_path)], capsys)
    assert status == 2 and err == [
        f"datacentric inspect: {tmp_path}: no checkpoint found (was the run started with --out?)"
    ]


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACENTRIC_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["inspect", str(tmp_path / "missing")])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-process run of 2 steps with a checkpoint after each (on one thread,
    as the tests: a module's fixture is set up before their ``one_thread``)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_rank(small_config(out, iterations=2, checkpoint_every=1, lr_schedule="cosine"))
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([], "already holds a run"),
        (["--resume", "--max-tokens", "128"], "max_tokens"),
        (["--resume", "--model-arg", "num_layers=1"], "model.model_args"),
        (["--resume", "--policy", "packed"], "policy"),
        (["--resume", "--seed", "5"], "seed"),
        (["--resume-from", "7"], "step 7"),
        (["--resume-from", "nowhere"], "nowhere"),
    ],
)
def test_refused_runs_change_nothing(finished_run, extra, named, tmp_path, capsys):
    before = snapshot(finished_run)
    argv = ["train", "--out", str(finished_run), *TINY, "--iterations", "3", *extra]
    status, err = run_cli(argv, capsys)
    assert status == 2
    assert len(errors_only(err)) == 1 and named in errors_only(err)[0], err
    assert snapshot(finished_run) == before


@pytest.mark.slow
def test_a_resume_takes_the_new_name_of_a_setting(finished_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    renamed = [f for f in TINY if f not in ("--tokens-per-iteration", "1024")]
    argv = ["train", "--out", str(out), *renamed, "--global-batch-tokens", "1024"]
    status, err = run_cli([*argv, "--iterations", "3", "--resume"], capsys)
    assert status == 0, err


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters())


def test_second_save_of_a_step_switches_latest_then_deletes(tmp_path):
    model, opt = _model_and_optimizer()
    first = ckpt.save_checkpoint(tmp_path, 3, model, opt, {"n": 1})
    second = ckpt.save_checkpoint(tmp_path, 3, model, opt, {"n": 2})
    assert second != first and not first.exists()
    assert ckpt.latest_checkpoint(tmp_path) == second
    assert ckpt.verify_checkpoint(second)["n"] == 2
    ckpt.save_checkpoint(tmp_path, 4, model, opt, {"n": 3}, keep_last=1)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000004"]


def test_dangling_or_corrupt_latest_falls_back_with_a_notice(tmp_path, capsys):
    model, opt = _model_and_optimizer()
    older = ckpt.save_checkpoint(tmp_path, 1, model, opt, {"n": 1})
    newer = ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
    shard = next(p for p in newer.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-4] + b"oops")
    with pytest.raises(ckpt.CheckpointError, match=f"--resume-from {older}"):
        ckpt.verify_checkpoint(newer)
    path, notice = ckpt.find_checkpoint(tmp_path)
    assert path == older and "checksum mismatch" in notice and older.name in notice
    (tmp_path / "checkpoints" / "latest").write_text("step-00000009")
    path, notice = ckpt.find_checkpoint(tmp_path)
    assert path == older and "does not exist" in notice


def test_full_disk_is_named(tmp_path, monkeypatch):
    model, opt = _model_and_optimizer()
    kept = ckpt.save_checkpoint(tmp_path, 1, model, opt, {"n": 1})
    before = snapshot(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_save.dcp, "save", full)
    with pytest.raises(ckpt.CheckpointError, match="no space left on device while saving"):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
    assert snapshot(tmp_path) == before and ckpt.latest_checkpoint(tmp_path) == kept


def test_full_disk_on_one_rank_of_dcp_is_named(tmp_path, monkeypatch):
    from torch.distributed.checkpoint.api import CheckpointException

    model, opt = _model_and_optimizer()

    def failing(full: bool):
        def save(*args, **kwargs):
            error = OSError(errno.ENOSPC, "No space left on device") if full else KeyError("x")
            raise CheckpointException("CheckpointException", {1: (error, None)})

        return save

    monkeypatch.setattr(checkpoint_save.dcp, "save", failing(True))
    with pytest.raises(ckpt.CheckpointError, match="no space left on device while saving"):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})
    monkeypatch.setattr(checkpoint_save.dcp, "save", failing(False))
    with pytest.raises(ckpt.CheckpointError, match="failed: rank 1: KeyError: 'x'"):
        ckpt.save_checkpoint(tmp_path, 2, model, opt, {"n": 2})


def test_checkpoint_of_another_model_says_so(tmp_path):
    model, opt = _model_and_optimizer()
    path = ckpt.save_checkpoint(tmp_path, 1, model, opt, {"config": {"model": "llama"}})
    with pytest.raises(ckpt.CheckpointError, match="holds a 'llama' model, this run builds 'dit'"):
        ckpt.load_checkpoint(path, model, opt, expect_model="dit")
    bigger = torch.nn.Linear(4, 3)
    with pytest.raises(ckpt.CheckpointError, match="does not fit this model"):
        ckpt.load_checkpoint(path, bigger, torch.optim.AdamW(bigger.parameters()))


@pytest.mark.slow
def test_resume_lr_horizon_extend_and_first(tmp_path, capsys):
    out = tmp_path / "run"
    train_rank(small_config(out, iterations=2, checkpoint_every=1, warmup_iterations=1))
    longer = small_config(out, iterations=4, resume=True, warmup_iterations=1)
    train_rank(longer)
    assert "learning-rate horizon 4 steps (the checkpoint's run planned 2)" in (
        capsys.readouterr().err
    )
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    factor = lr_lambda(longer.training, 4)
    for record in records[2:]:
        assert record["lr"] == pytest.approx(longer.lr * factor(record["iteration"]))
    # lr_horizon = "first": a further resume keeps the horizon of 4 (past it: the minimum)
    train_rank(small_config(out, iterations=5, resume=True, warmup_iterations=1,
                            lr_horizon="first"))  # fmt: skip
    assert (
        "learning-rate horizon 4 steps (the checkpoint's run planned 4)"
        not in (err := capsys.readouterr().err)
        and "learning-rate horizon 4 steps" in err
    )
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["iteration"] == 4 and last["lr"] == pytest.approx(longer.lr * 0.1)
    # the horizon is the schedule's only: the run's last step (its steps, progress bar,
    # validation after the last step) is this command's 5, and a next resume keeps 4
    assert "steps 5-5 of 5 (1 to run)" in err and "steps done already" not in err, err
    saved = json.loads((out / "checkpoints" / "step-00000005" / "trainer.json").read_text())
    assert saved["total_iterations"] == 4


@pytest.mark.slow
def test_restart_before_the_first_checkpoint_does_not_duplicate_logs(tmp_path):
    out = tmp_path / "run"
    config = small_config(out, iterations=2, checkpoint_every=0, fault_inject="0:1")
    from datacentric.parallel.launch import spawn

    with pytest.raises(RuntimeError, match="rank 0"):
        spawn(train_rank, 1, config, timeout_s=600)
    assert not (out / "checkpoints").exists() and (out / "metrics.jsonl").exists()
    train_rank(small_config(out, iterations=2, resume=True))
    for name in ("metrics.jsonl", "samples.jsonl"):
        steps = [json.loads(ln)["iteration"] for ln in (out / name).read_text().splitlines()]
        assert steps == [0, 1], name


@pytest.mark.slow
def test_overwrite_replaces_the_run(finished_run, capsys):
    status, _ = run_cli(["train", "--out", str(finished_run), *TINY, "--iterations", "1",
                         "--overwrite"], capsys)  # fmt: skip
    assert status == 0
    assert [p.name for p in ckpt.list_checkpoints(finished_run)] == ["step-00000001"]
    # the folder records the run, not what its start did once (clear the folder, resume
    # a named checkpoint of a pinned manifest): its config.toml fed back with --resume
    # continues the run from its latest step, never deletes or rewinds it
    first = ckpt.list_checkpoints(finished_run)[0]
    pin = hashlib.sha256((first / "manifest.json").read_bytes()).hexdigest()
    status, _ = run_cli(["train", "--config", str(finished_run / "config.toml"), "--iterations",
                         "2", "--resume-from", "1", "--expect-sha256", pin], capsys)  # fmt: skip
    assert status == 0
    for record in (finished_run / "config.json", first.parent / "step-00000002/trainer.json"):
        settings = json.loads(record.read_text())
        settings = settings.get("config", settings)
        recorded = settings["job"]["overwrite"], settings["checkpoint"]["resume_from"]
        assert recorded == (False, None) and not settings["checkpoint"]["expect_sha256"], record
    fed_back = load_config(finished_run / "config.toml", resume=True).checkpoint
    assert (fed_back.resume_from, fed_back.expect_sha256) == (None, None)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "datacentric", "train", "--world", "2", *TINY]
    cmd += ["--epochs", "50", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    ranks = _descendants(launcher.pid)
    assert ranks, "no rank processes found"
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in ranks if _alive(p)]
    assert launcher.returncode == 128 + signal.SIGTERM
