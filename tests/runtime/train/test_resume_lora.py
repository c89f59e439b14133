"""A resume keeps every setting that changes the trained function, ``[lora]`` included:
another alpha, dropout, rank or target list is refused in one line naming the setting
and both values, before any tensor is read; non-finite LoRA settings never pass the
settings check."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_config import SMALL_TRAIN_FLAGS, small_config
from test_reliability_cases import errors_only, run_cli, snapshot

from datacentric.train.trainer import train_rank

LORA = ["--lora.rank", "2", "--lora.alpha", "4"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A finished one-process LoRA run (rank 2, alpha 4) of 2 steps, saved after each."""
    out = tmp_path_factory.mktemp("lora") / "run"
    train_rank(small_config(out, iterations=2, checkpoint_every=1, lora_rank=2, lora_alpha=4.0))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (["--lora.alpha", "16"], "lora.alpha (4.0 -> 16.0)"),
        (["--lora.dropout", "0.1"], "lora.dropout (0.0 -> 0.1)"),
        (["--lora.targets", "wq,wv"], "lora.targets (None -> 'wq,wv')"),
        (["--lora.rank", "4"], "lora.rank (2 -> 4)"),
    ],
)
def test_a_resume_with_other_lora_settings_is_refused(lora_run, changed, named, capsys):
    before = snapshot(lora_run)
    argv = ["train", "--out", str(lora_run), *SMALL_TRAIN_FLAGS, *LORA, *changed]
    status, err = run_cli([*argv, "--iterations", "3", "--resume"], capsys)
    assert status == 2, err
    (line,) = errors_only(err)
    assert "changed since it was saved" in line and named in line, line
    assert "Missing key" not in line and snapshot(lora_run) == before


@pytest.mark.slow
def test_the_same_lora_settings_resume(lora_run, tmp_path, capsys):
    argv = ["train", "--out", str(lora_run), *SMALL_TRAIN_FLAGS, *LORA]
    status, err = run_cli([*argv, "--iterations", "3", "--resume"], capsys)
    assert status == 0, err


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
@pytest.mark.parametrize("flag", ["--lora.alpha", "--lora.dropout", "--lr"])
def test_non_finite_settings_are_refused_by_the_schema(flag, value, tmp_path, capsys):
    status, err = run_cli(["train", "--out", str(tmp_path / "run"), f"{flag}={value}"], capsys)
    assert status == 2 and len(err) == 1, err
    assert "needs a finite number" in err[0] and flag.lstrip("-") in err[0], err
    assert not (tmp_path / "run").exists()
