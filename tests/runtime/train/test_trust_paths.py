"""Trust, round two (docs/reliability.md, "Trust"): every path read from a checkpoint stays
inside it, so a pin covers the weights; the lock file never writes through a link."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from run_config import SMALL_TRAIN_FLAGS, small_config
from test_reliability_cases import errors_only, run_cli, snapshot
from test_trust import resume, rewrite_manifest

from datacentric.train.checkpoints import checkpoint as ckpt
from datacentric.train.checkpoints.safe_load import read_metadata_file
from datacentric.train.reporting.metrics import read_metrics
from datacentric.train.run_folder import LOCK_FILE, RunFolderError, RunFolderLock
from datacentric.train.trainer import train_rank


def one_step_run(tmp_path_factory) -> Path:
    """A finished one-process run of one step."""
    out = tmp_path_factory.mktemp("trusted") / "run"
    train_rank(small_config(out, iterations=1))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return one_step_run(tmp_path_factory)


def copy_run(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(a copy of the run folder, its checkpoint)."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out, ckpt.latest_checkpoint(out)


def refused(status: int, err: list[str], *words: str) -> str:
    """The one error line of a refusal (exit 2) holding every one of ``words``."""
    lines = errors_only(err)
    assert status == 2 and len(lines) == 1, err
    assert all(word in lines[0] for word in words), lines
    assert "internal error" not in lines[0], lines
    return lines[0]


# ---------------------------------------------------------------- the lock


def test_the_lock_never_writes_through_a_link_and_a_stale_lock_is_reused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "run"
    out.mkdir()
    lock_path = out / LOCK_FILE
    for make, what in ((os.symlink, "symbolic link"), (os.link, "hard link")):
        make(victim, lock_path)
        with pytest.raises(RunFolderError, match=what):
            RunFolderLock(out).acquire()
        assert victim.read_text() == "precious\n" and os.path.lexists(lock_path)
        lock_path.unlink()
    lock_path.mkdir()
    with pytest.raises(RunFolderError, match="a folder"):
        RunFolderLock(out).acquire()
    lock_path.rmdir()
    lock_path.write_text("host gone pid 1\n")  # a crashed run's: nobody holds it
    with RunFolderLock(out):
        assert lock_path.read_text().startswith("host ") and "pid 1\n" not in lock_path.read_text()
    assert not lock_path.exists() and victim.read_text() == "precious\n"


@pytest.mark.parametrize("mode", ["fresh", "resume", "refused"])
def test_train_refuses_a_linked_lock_in_one_line(trained, tmp_path, capsys, mode):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = copy_run(trained, tmp_path)[0] if mode != "fresh" else tmp_path / "new"
    out.mkdir(exist_ok=True)
    os.symlink(victim, out / LOCK_FILE)
    before = snapshot(out)
    extra = {"fresh": [], "resume": ["--resume"], "refused": []}[mode]
    argv = ["train", "--out", str(out), *SMALL_TRAIN_FLAGS, "--iterations", "2", *extra]
    status, err = run_cli(argv, capsys)
    refused(status, err, str(out / LOCK_FILE), "symbolic link")
    assert victim.read_text() == "precious\n" and (out / LOCK_FILE).is_symlink()
    assert snapshot(out) == before


def test_train_never_writes_through_a_linked_run_file(trained, tmp_path, capsys):
    out, _ = copy_run(trained, tmp_path)
    victim = tmp_path / "victim.json"
    shutil.move(out / "config.json", victim)
    os.symlink(victim, out / "config.json")
    before = victim.read_text()
    refused(*resume(out, capsys), str(out / "config.json"), "symbolic link")
    assert victim.read_text() == before and (out / "config.json").is_symlink()


# ---------------------------------------------------------------- paths in a checkpoint


def point_shards_at(checkpoint: Path, outside: Path, absolute: bool) -> None:
    """What an attacker does: the shard moves out of the checkpoint, ``.metadata`` names
    it there (an absolute path or ``../``), and the manifest is rewritten."""
    shard = next(checkpoint.glob("*.distcp"))
    shutil.move(shard, outside)
    metadata = read_metadata_file(checkpoint / ".metadata")
    named = str(outside) if absolute else os.path.relpath(outside, checkpoint)
    for info in metadata.storage_data.values():
        info.relative_path = named
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    rewrite_manifest(checkpoint)


@pytest.mark.slow
@pytest.mark.parametrize("absolute", [True, False])
def test_a_shard_outside_the_checkpoint_is_refused_even_when_pinned(
    trained, tmp_path, capsys, absolute
):
    out, checkpoint = copy_run(trained, tmp_path)
    point_shards_at(checkpoint, tmp_path / "elsewhere.distcp", absolute)
    pin = ckpt.manifest_sha256(checkpoint)
    before = snapshot(out)
    for status, err in (
        run_cli(["inspect", str(out), "--json", "--expect-sha256", pin], capsys),
        resume(out, capsys, "--expect-sha256", pin),
    ):
        refused(status, err, ".metadata", "elsewhere.distcp", "not a file")
    assert snapshot(out) == before  # nothing trained, nothing rewritten


def test_a_manifest_naming_a_file_outside_is_refused(trained, tmp_path, capsys):
    out, checkpoint = copy_run(trained, tmp_path)
    (tmp_path / "outside").write_text("x")
    manifest = json.loads((checkpoint / ckpt.MANIFEST).read_text())
    manifest["../../../outside"] = "0" * 64
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps(manifest))
    refused(*run_cli(["inspect", str(out)], capsys), "outside", ckpt.MANIFEST)


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_latest_pointing_outside_the_run_is_refused(trained, tmp_path, capsys, how):
    out, checkpoint = copy_run(trained, tmp_path)
    away = tmp_path / "away" / checkpoint.name
    shutil.copytree(checkpoint, away)
    latest = out / "checkpoints" / "latest"
    if how == "link":
        os.symlink(away, out / "checkpoints" / "step-00000099")
        latest.write_text("step-00000099")
    else:
        latest.write_text(str(away) if how == "absolute" else f"../../away/{away.name}")
    pin = ckpt.manifest_sha256(away)
    shutil.rmtree(checkpoint)  # no checkpoint of the run's own to fall back to
    for argv in (["inspect", str(out)], ["inspect", str(out), "--expect-sha256", pin]):
        refused(*run_cli(argv, capsys), str(latest), "outside")
    assert ckpt.list_checkpoints(out) == []  # a linked folder is not one of the run's


def test_expect_sha256_with_no_checkpoint_is_an_error(tmp_path, capsys):
    out = tmp_path / "run"
    status, err = resume(out, capsys, "--expect-sha256", "a" * 64)
    refused(status, err, "--expect-sha256", "no checkpoint")
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


# ---------------------------------------------------------------- what a run appends to


@pytest.mark.slow
def test_a_torn_metrics_line_is_skipped_and_trace_steps_outside_the_run_warn(
    trained, tmp_path, capsys, caplog
):
    out, _ = copy_run(trained, tmp_path)
    whole = (out / "metrics.jsonl").read_text()
    torn = whole + '{"iteration": 1, "lo'  # the run was killed mid-line
    (out / "metrics.jsonl").write_text(torn)
    status, err = resume(out, capsys, "--trace-steps", "2,100")
    assert status == 0, err
    assert len([ln for ln in err if "no trace for step 100" in ln]) == 1, err
    assert any("metrics.jsonl:2: skipped a torn last line" in ln for ln in err), err
    assert [r["iteration"] for r in read_metrics(out)] == [0, 1]
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["step-2-rank0.json"]
    (out / "metrics.jsonl").write_text(torn)
    with caplog.at_level("WARNING"):
        assert read_metrics(out) == read_metrics(trained)
    assert "metrics.jsonl:2: skipped a torn last line" in caplog.text
    (out / "metrics.jsonl").write_text('{"iteration": 0, "lo\n' + whole)  # not the last
    with pytest.raises(ValueError, match=r"metrics.jsonl:1 is not a JSON record"):
        read_metrics(out)
