"""A run saves its settings by section (``config.json`` and its checkpoints' record); a
run folder of an earlier release, whose records hold flat keys, still inspects, exports
and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reliability_cases import run_cli
from test_trust import rewrite_manifest
from test_trust_paths import copy_run, one_step_run, resume

from datacentric.settings import SECTIONS
from datacentric.settings.layout import key_of
from datacentric.train.checkpoints import checkpoint as ckpt


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return one_step_run(tmp_path_factory)


def flat(record: dict) -> dict:
    """A sectioned settings record as an earlier release wrote it: flat keys."""
    return {
        key_of(section, name): value
        for section, fields in record.items()
        for name, value in fields.items()
    }


def as_earlier_release(run: Path) -> None:
    """Rewrite the run's ``config.json`` and its checkpoint's record with flat keys."""
    checkpoint = ckpt.latest_checkpoint(run)
    (run / "config.json").write_text(
        json.dumps(flat(json.loads((run / "config.json").read_text())))
    )
    trainer = json.loads((checkpoint / ckpt.TRAINER_FILE).read_text())
    trainer["config"] = flat(trainer["config"])
    (checkpoint / ckpt.TRAINER_FILE).write_text(json.dumps(trainer))
    rewrite_manifest(checkpoint)


def test_a_run_saves_its_settings_by_section(trained):
    record = json.loads((trained / "config.json").read_text())
    assert list(record) == list(SECTIONS) and all(isinstance(v, dict) for v in record.values())
    trainer = json.loads((ckpt.latest_checkpoint(trained) / ckpt.TRAINER_FILE).read_text())
    assert trainer["config"] == record


def test_an_earlier_release_run_folder_inspects_exports_and_resumes(trained, tmp_path, capsys):
    run, _ = copy_run(trained, tmp_path)
    as_earlier_release(run)
    assert "lr" in json.loads((run / "config.json").read_text())  # the fixture is flat
    status, err = run_cli(["inspect", str(run)], capsys)
    assert status == 0, err
    status, err = run_cli(["export", str(run), "--out", str(tmp_path / "exported")], capsys)
    assert status == 0, err
    status, err = resume(run, capsys)
    assert status == 0, err
    again = json.loads((run / "config.json").read_text())
    assert list(again) == list(SECTIONS)  # the resumed run writes sections


def test_an_earlier_release_checkpoint_with_other_settings_is_refused(trained, tmp_path, capsys):
    run, _ = copy_run(trained, tmp_path)
    as_earlier_release(run)
    status, err = resume(run, capsys, "--scheduling.policy", "static")
    assert status == 2 and any("scheduling.policy" in line for line in err), err
