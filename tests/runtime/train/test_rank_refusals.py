"""Refusals only the ranks can make reach ``datacentric train --world 2`` as the line
one process says: no ``rank R failed: Type:`` in front, exit status 2, and ``on rank R
of 2`` after it only where not every rank refused (they said 'rank 0 failed:
NonFiniteLossError: iteration 1 ...' and 'rank 0 failed: UnsafeFileError: ...')."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from run_config import SMALL_TRAIN_FLAGS, small_config
from test_reliability_cases import errors_only, run_cli
from test_trust import Payload, resume, rewrite_manifest, tampered

from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def one_step(tmp_path_factory) -> Path:
    """A finished one-process run of one step (its checkpoint: step 1)."""
    out = tmp_path_factory.mktemp("ranks") / "run"
    train_rank(small_config(out, iterations=1))
    return out


def refusal(status: int, err: list[str]) -> str:
    """The one line a refused command said (exit status 2), its last (a run that
    trained a step said so before it)."""
    lines = [ln for ln in errors_only(err) if ln.startswith("datacentric train: ")]
    assert status == 2 and lines == err[-1:], err
    assert not re.search(r"failed: |\w+Error: ", lines[0]), lines
    return lines[0]


@pytest.mark.slow
def test_a_loss_that_is_not_finite_is_the_same_line_at_world_1_and_2(tmp_path, capsys):
    argv = ["train", *SMALL_TRAIN_FLAGS, "--iterations", "2", "--lr", "1e30"]
    argv += ["--warmup-iterations", "0"]
    lines = [
        refusal(*run_cli([*argv, "--world", world, "--out", str(tmp_path / world)], capsys))
        for world in ("1", "2")
    ]
    assert lines[0] == lines[1]  # every rank refused: no rank named
    assert "loss is nan" in lines[0] and "lower the learning rate" in lines[0], lines[0]


@pytest.mark.slow
def test_a_damaged_checkpoint_file_is_the_same_line_at_world_1_and_2(one_step, tmp_path, capsys):
    out, checkpoint, _ = tampered(one_step, tmp_path)
    shard = next(checkpoint.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-100] ^= 1
    shard.write_bytes(bytes(data))
    lines = [refusal(*resume(out, capsys, "--world", world)) for world in ("1", "2")]
    assert lines[0] == lines[1]  # every rank verifies the checkpoint it loads
    assert lines[0].startswith(
        f"datacentric train: {checkpoint}: checksum mismatch for {shard.name}; "
    ), lines[0]


@pytest.mark.slow
def test_a_refusal_of_one_rank_names_it_at_the_end(one_step, tmp_path, capsys):
    """A checkpoint of one process resumed on two ranks: rank 0 alone reads the RNG file
    it saved (rank 1 keeps its own stream), and refuses a crafted one."""
    out, checkpoint, marker = tampered(one_step, tmp_path)
    rng = checkpoint / "rng-rank0.pt"
    torch.save({"torch": Payload(marker)}, rng)
    rewrite_manifest(checkpoint)
    lines = [refusal(*resume(out, capsys, "--world", world)) for world in ("1", "2")]
    assert lines[0].startswith(f"datacentric train: {rng}: refused to load: "), lines[0]
    assert lines[1] == lines[0] + " (on rank 0 of 2)"
    assert not marker.exists()
