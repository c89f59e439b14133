"""Opening a run folder never runs code from it (docs/reliability.md, "Trust"): every
pickle of a checkpoint carries a payload that would create a file when unpickled, and
``train --resume`` and ``inspect`` either read the checkpoint safely or exit 2 naming
the file; the payload never runs."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from repo_paths import ROOT
from run_config import SMALL_TRAIN_FLAGS, small_config
from test_reliability_cases import errors_only, run_cli
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from datacentric.train.checkpoints import checkpoint as ckpt
from datacentric.train.trainer import train_rank


class Payload:
    """Creates ``marker`` when unpickled (``open(marker, "w")``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished one-process run of one step."""
    out = tmp_path_factory.mktemp("trusted") / "run"
    train_rank(small_config(out, iterations=1))
    return out


def tampered(trained: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(run folder copy, its checkpoint, the payload's marker path)."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out, ckpt.latest_checkpoint(out), tmp_path / "payload-ran"


def rewrite_manifest(checkpoint: Path) -> None:
    """What an attacker does: the manifest sits in the same folder."""
    files = sorted(p for p in checkpoint.iterdir() if p.is_file() and p.name != ckpt.MANIFEST)
    manifest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps(manifest))


def resume(out: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    argv = ["train", "--out", str(out), *SMALL_TRAIN_FLAGS, "--iterations", "2", "--resume"]
    return run_cli([*argv, *extra], capsys)


def assert_refused(status: int, err: list[str], named: Path) -> None:
    lines = errors_only(err)
    assert status == 2 and len(lines) == 1, err
    assert str(named) in lines[0] and "refused to load" in lines[0], lines


@pytest.mark.slow
def test_a_crafted_rng_file_is_refused_and_never_runs(trained, tmp_path, capsys):
    out, checkpoint, marker = tampered(trained, tmp_path)
    rng = checkpoint / "rng-rank0.pt"
    torch.save({"torch": Payload(marker)}, rng)
    rewrite_manifest(checkpoint)
    status, err = resume(out, capsys)
    assert_refused(status, err, rng)
    assert not marker.exists()
    status, err = run_cli(["inspect", str(out), "--json"], capsys)  # reads no RNG state
    assert status == 0 and not marker.exists(), err


@pytest.mark.slow
def test_crafted_dcp_metadata_is_refused_and_never_runs(trained, tmp_path, capsys):
    out, checkpoint, marker = tampered(trained, tmp_path)
    (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    rewrite_manifest(checkpoint)
    for status, err in (resume(out, capsys), run_cli(["inspect", str(out)], capsys)):
        assert_refused(status, err, checkpoint / ".metadata")
        assert not marker.exists()


@pytest.mark.slow
def test_a_crafted_shard_entry_is_refused_and_never_runs(trained, tmp_path, capsys):
    out, checkpoint, marker = tampered(trained, tmp_path)
    state: dict = {}  # the whole checkpoint (ours, trusted here), one entry replaced
    reader = dcp.FileSystemReader(str(checkpoint))
    _load_state_dict(state, reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    state["optimizer"]["param_groups"][0]["lr"] = Payload(marker)
    for p in checkpoint.iterdir():
        if p.suffix == ".distcp" or p.name == ".metadata":
            p.unlink()
    dcp.save(state, checkpoint_id=str(checkpoint), no_dist=True)
    assert not marker.exists()
    rewrite_manifest(checkpoint)
    status, err = resume(out, capsys)
    shard = next(checkpoint.glob("*.distcp"))
    assert_refused(status, err, shard)
    assert not marker.exists()


@pytest.mark.slow
def test_expect_sha256_pins_the_checkpoint(trained, tmp_path, capsys):
    out, checkpoint, _ = tampered(trained, tmp_path)
    status, _ = run_cli(["inspect", str(out), "--json"], capsys)
    digest = ckpt.manifest_sha256(checkpoint)
    wrong = "0" * 64
    for status, err in (
        resume(out, capsys, "--expect-sha256", wrong),
        run_cli(["inspect", str(out), "--expect-sha256", wrong], capsys),
    ):
        lines = errors_only(err)
        assert status == 2 and len(lines) == 1, err
        assert "manifest.json" in lines[0] and wrong in lines[0] and digest in lines[0]
    status, _ = run_cli(["inspect", str(out), "--json", "--expect-sha256", digest], capsys)
    assert status == 0
    status, err = resume(out, capsys, "--expect-sha256", digest.upper())
    assert status == 0, err
    saved = [ln for ln in err if "manifest sha256" in ln]
    assert saved and re.search(r"manifest sha256 [0-9a-f]{64}", saved[-1])


def test_a_resume_reads_the_checkpoint_s_record_only_once_its_pin_and_checksum_hold(
    trained, tmp_path, capsys
):
    """The check before the ranks start reads the checkpoint ``--resume-from`` names (not
    verified as ``--resume``'s newest is) as the load does: a pin first, then the
    record's SHA-256 in the manifest. A record edited to another seed is named by the
    pin, or as corrupt, never read as the run's settings (before: "changed since it was
    saved: job.seed", from the unchecked record)."""
    out, checkpoint, _ = tampered(trained, tmp_path)
    record = json.loads((checkpoint / ckpt.TRAINER_FILE).read_text())
    record["config"]["job"]["seed"] += 1
    (checkpoint / ckpt.TRAINER_FILE).write_text(json.dumps(record))
    wrong = "0" * 64
    argv = ["train", "--out", str(out), *SMALL_TRAIN_FLAGS, "--iterations", "2"]
    argv += ["--resume-from", str(checkpoint)]
    for extra, named in ((["--expect-sha256", wrong], wrong), ([], "checksum mismatch")):
        status, err = run_cli([*argv, *extra], capsys)
        lines = errors_only(err)
        assert status == 2 and len(lines) == 1, err
        assert named in lines[0] and "changed since" not in lines[0], lines[0]


def test_expect_sha256_needs_a_resume_and_a_digest(tmp_path, capsys):
    argv = ["train", "--out", str(tmp_path / "run"), "--expect-sha256"]
    status, err = run_cli([*argv, "abc", "--resume"], capsys)
    assert status == 2 and "checkpoint.expect_sha256" in err[0] and "64" in err[0]
    status, err = run_cli([*argv, "a" * 64], capsys)
    assert status == 2 and "--resume" in err[0]
    assert not (tmp_path / "run").exists()


def test_no_unrestricted_unpickling_in_the_package():
    root = ROOT / "datacentric"
    found = [
        f"{path}:{number}"
        for path in root.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "weights_only=False" in line and "# trusted:" not in line
    ]
    assert not found, found
