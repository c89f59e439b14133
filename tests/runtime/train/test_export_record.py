"""``export --overwrite`` deletes only what export wrote: the output folder's
``datacentric_export.json`` must be export's own (plain names of the folder, each with
the SHA-256 export wrote it with) and every file it lists must still have that content;
a crafted or stale record deletes nothing."""

from __future__ import annotations

import json

import pytest
from test_reliability_cases import run_cli, snapshot
from test_trust_paths import copy_run, one_step_run, refused

from datacentric.train.exporting.export import EXPORT_RECORD


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return one_step_run(tmp_path_factory)


def _export(run, out, capsys, *extra):
    return run_cli(["export", str(run), "--out", str(out), *extra], capsys)


@pytest.mark.slow
def test_a_crafted_or_stale_record_deletes_nothing(trained, tmp_path, capsys) -> None:
    run, _ = copy_run(trained, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    crafted = [
        {"files": ["thesis.tex"]},  # the old attack: a list of names, no hashes
        {"files": ["thesis.tex"], "sha256": {"thesis.tex": "0" * 64}},
        {"files": ["../thesis.tex"], "sha256": {"../thesis.tex": "0" * 64}},
        {"files": ["thesis.tex"], "sha256": {}},
    ]
    for record in crafted:
        (mine / EXPORT_RECORD).write_text(json.dumps(record))
        before = snapshot(mine)
        refused(*_export(run, mine, capsys, "--overwrite"), f"--out {mine}")
        assert snapshot(mine) == before and (mine / "thesis.tex").read_text() == "years of work"

    exported = tmp_path / "exported"
    assert _export(run, exported, capsys)[0] == 0
    record = json.loads((exported / EXPORT_RECORD).read_text())
    assert sorted(record["sha256"]) == record["files"]
    first = snapshot(exported)
    status, err = _export(run, exported, capsys, "--overwrite")
    assert status == 0 and snapshot(exported) == first, err  # its own record: replaced
    weights = exported / record["files"][0]
    weights.write_bytes(b"edited since the export")  # a file the user changed afterwards
    before = snapshot(exported)
    line = refused(*_export(run, exported, capsys, "--overwrite"), "nothing was deleted")
    assert weights.name in line and snapshot(exported) == before
