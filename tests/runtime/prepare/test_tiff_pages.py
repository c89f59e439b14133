"""A TIFF of several pages trains its first page alone; prepare names each such file
with the pages it leaves out, in ``prepare_report.json`` (``pages_left_out``) and in a
note at the end of the run, with the fix. Its other pages were dropped without a word."""

from __future__ import annotations

import json

import numpy as np
import pytest
from prepare_media import save_wan_pipeline

from datacentric.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

pytest.importorskip("diffusers")
Image = pytest.importorskip("PIL.Image")


def _write_tiff(path, pages: int) -> None:
    frames = [
        Image.fromarray(np.full((32, 32, 3), 40 * (k + 1), dtype=np.uint8)) for k in range(pages)
    ]
    frames[0].save(path, save_all=True, append_images=frames[1:])


def test_a_tiff_of_several_pages_is_named_with_the_pages_left_out(tmp_path, capsys):
    pipe = save_wan_pipeline(tmp_path / "pipe")
    media = tmp_path / "media"
    media.mkdir()
    _write_tiff(media / "scan.tiff", 3)
    _write_tiff(media / "photo.tif", 1)
    for name in ("scan", "photo"):
        (media / f"{name}.txt").write_text("a cat walks on the grass", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["prepare", "--pipeline", str(pipe), "--media", str(media), "--out", str(out)]) == 0
    report = json.loads((out / "prepare_report.json").read_text(encoding="utf-8"))
    assert (report["samples"], report["skipped"]) == (2, 0)
    assert report["pages_left_out"] == [
        {"source": "scan.tiff", "where": str(media / "scan.txt"), "pages": 3, "left_out": "2-3"}
    ]
    err = capsys.readouterr().err
    assert (
        "prepare: note: scan.tiff: a TIFF of 3 pages trains its first page alone; pages 2-3 "
        "are left out (split its pages into files, each with its caption, to train them)"
    ) in err, err
    assert "photo.tif" not in err


def test_past_ten_tiffs_the_others_are_counted():
    from datacentric.cli.prepare import pages_notes

    paged = [{"source": f"s{k}.tif", "pages": 2, "left_out": "2"} for k in range(12)]
    notes = pages_notes({"pages_left_out": paged}, "out")
    assert len(notes) == 11 and notes[0].startswith("note: s0.tif: a TIFF of 2 pages")
    assert "page 2 is left out" in notes[0]
    assert notes[-1] == (
        "note: 2 more TIFFs of several pages train their first page alone: see "
        "pages_left_out in out/prepare_report.json"
    )
    assert pages_notes({}, "out") == []
