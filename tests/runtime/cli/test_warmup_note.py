"""A learning-rate warm-up longer than the run is said before the ranks start: the rate
never reaches ``training.lr`` (the default warm-up of 2 steps on a 1-step run trains at
half of it)."""

from __future__ import annotations

import json

import pytest

from datacentric.cli.precheck import check_dataset
from datacentric.settings import load_config


@pytest.mark.parametrize(
    ("settings", "note"),
    [
        (dict(iterations=1), "2 is more than the run's 1 step"),
        (dict(warmup_iterations=20), "20 is more than the run's 8 steps"),
        (dict(warmup_iterations=20, epochs=2), "20 is more than the run's 16 steps"),
        (dict(), None),  # 2 warm-up steps of 8
        (dict(warmup_iterations=8), None),  # the last step reaches the peak
    ],
)
def test_a_warmup_longer_than_the_run_is_said(settings, note, tmp_path, capsys):
    words = "the cat walks on grass under a blue sky while birds fly".split()
    rows = [" ".join(words[(i + k) % len(words)] for k in range(20 + 13 * i)) for i in range(24)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows), encoding="utf-8")
    config = load_config(
        None, model="llama", dataset=f"jsonl:{data}", out=str(tmp_path), **settings
    )
    assert check_dataset(config, "train") is not None
    err = capsys.readouterr().err
    assert "8 steps an epoch" in err  # the sized global batch the steps are counted in
    said = [line for line in err.splitlines() if "warmup_iterations" in line]
    if note is None:
        assert not said, err
        return
    steps = int(note.split("run's ")[1].split()[0])
    warmup = int(note.split()[0])
    assert said == [
        f"datacentric train: note: training.warmup_iterations {note}: the learning rate "
        f"stays in its warm-up and reaches {steps / warmup:.3g} of training.lr at the last "
        "step (--warmup-iterations sets it)"
    ]
