"""A ``prepare`` resumed after the media readers changed does not mix two readings of the
files: the clips an earlier reading encoded (their records state no reading revision, or
another one) are encoded again, said in one line, and the folder then holds what a fresh
``prepare`` writes; a resume by the same reading still encodes nothing done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prepare_media import save_wan_pipeline, write_media

from datacentric.data.media_decode import READING_REVISION, decode
from datacentric.prepare import PrepareJob, prepare
from datacentric.prepare import run as prepare_run

pytestmark = pytest.mark.usefixtures("one_thread")

pytest.importorskip("diffusers")
pytest.importorskip("av")

#: (file, frames, height, width, caption): small clips of two sizes
CLIPS = [
    ("first.mp4", 5, 32, 32, "a cat walks on the grass"),
    ("second.mp4", 5, 32, 48, "red car drives past green trees"),
]


def _mirrored(item, indices=None):
    """An earlier reading of the files: the frames the readers give, mirrored (as a
    reader that ignored a display rotation gave them)."""
    from PIL import ImageOps

    return [ImageOps.mirror(frame) for frame in decode(item, indices)]


def _files(out: Path) -> dict[str, bytes]:
    """The latent and text files of ``out`` and its manifest, by name."""
    found = {f"latents/{p.name}": p.read_bytes() for p in (out / "latents").iterdir()}
    return {**found, "manifest.jsonl": (out / "manifest.jsonl").read_bytes()}


def _as_an_earlier_version_wrote(out: Path) -> None:
    """The records of ``out`` as an earlier version wrote them: the first states no
    reading revision (versions before it), the second an older one."""
    records = sorted((out / ".prepare" / "records").glob("*.json"))
    assert len(records) == 2
    for number, path in enumerate(records):
        record = json.loads(path.read_text(encoding="utf-8"))
        record.pop("reading", None)
        if number:
            record["reading"] = READING_REVISION - 1
        path.write_text(json.dumps(record), encoding="utf-8")


def test_a_resume_encodes_again_what_an_earlier_reading_encoded(tmp_path, monkeypatch, capsys):
    """Prepared by an earlier reading (mirrored frames) and resumed by this one: both
    clips are encoded again, in one line saying so, and the latents, text files and
    manifest equal a fresh prepare's byte for byte. Before, the resume kept the
    mirrored latents (nothing encoded). A further resume encodes nothing."""
    pipe = save_wan_pipeline(tmp_path / "pipe")
    media = write_media(tmp_path / "media", CLIPS)

    def job(name: str) -> PrepareJob:
        return PrepareJob(pipeline=str(pipe), media=str(media), out=str(tmp_path / name))

    fresh = prepare(job("fresh"))
    assert fresh["encoded"] == 2
    with monkeypatch.context() as patched:
        patched.setattr(prepare_run, "decode", _mirrored)
        prepare(job("resumed"))
    out = tmp_path / "resumed"
    assert _files(out) != _files(tmp_path / "fresh")  # the earlier reading's latents
    _as_an_earlier_version_wrote(out)
    capsys.readouterr()
    resumed = prepare(job("resumed"))
    assert _files(out) == _files(tmp_path / "fresh")
    said = [line for line in capsys.readouterr().err.splitlines() if "again" in line]
    revisions = ", ".join(sorted({"0", str(READING_REVISION - 1)}))
    assert said == [
        f"prepare: encoding again 2 clips that an earlier version read (media reading "
        f"revision {revisions}, now {READING_REVISION}: it read some files differently), "
        "so that every sample comes of one reading"
    ]
    counts = (resumed["encoded"], resumed["already_done"], resumed["encoded_again"])
    assert counts == (2, 0, 2)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "latents").iterdir()}
    again = prepare(job("resumed"))
    counts = (again["encoded"], again["already_done"], again["encoded_again"])
    assert counts == (0, 2, 0)
    assert "encoding again" not in capsys.readouterr().err  # the out path may say "again"
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "latents").iterdir()}


def test_a_resume_gives_the_reason_this_reading_skips_a_file_for(tmp_path, capsys):
    """A file skipped before it is encoded (here one that does not read) is reported with
    the reason this version gives, as a fresh prepare reports it, where an earlier
    version's record states another (this release words many reasons anew): the resume
    kept the earlier reason in ``prepare_report.json``. Nothing is encoded again."""
    pipe = save_wan_pipeline(tmp_path / "pipe")
    media = write_media(tmp_path / "media", CLIPS)
    (media.parent / "broken.mp4").write_bytes(b"no video here")
    with open(media, "a", encoding="utf-8") as listing:
        listing.write("broken.mp4,a dog runs\n")

    def job(name: str) -> PrepareJob:
        return PrepareJob(pipeline=str(pipe), media=str(media), out=str(tmp_path / name))

    fresh = prepare(job("fresh"))
    prepare(job("resumed"))
    out = tmp_path / "resumed"
    (path,) = (out / ".prepare" / "records").glob("broken-*.json")
    record = json.loads(path.read_text(encoding="utf-8"))
    record.pop("reading")
    path.write_text(json.dumps({**record, "skipped": "an earlier version's reason"}))
    capsys.readouterr()
    resumed = prepare(job("resumed"))
    assert [s["reason"] for s in resumed["skipped_files"]] == [
        s["reason"] for s in fresh["skipped_files"]
    ]
    assert len(fresh["skipped_files"]) == 1
    counts = (resumed["encoded"], resumed["already_done"], resumed["encoded_again"])
    assert counts == (0, 2, 0) and "again" not in capsys.readouterr().err
    assert json.loads(path.read_text(encoding="utf-8"))["reading"] == READING_REVISION
    assert _files(out) == _files(tmp_path / "fresh")
