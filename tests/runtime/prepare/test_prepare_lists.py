"""``prepare`` from a caption list as users write one, end to end on a tiny Wan pipeline:
captions reach ``manifest.jsonl`` exactly, a repeated line is one sample, a FIFO or a
folder listed as a clip is skipped naming what it is, a rerun counts only the samples
encoded before, settings are as given or refused, and a full disk leaves nothing behind."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
from pathlib import Path

import pytest
from prepare_media import save_wan_pipeline, write_clip

pytest.importorskip("diffusers")
pytest.importorskip("av")

import datacentric.prepare.run as prepare_run  # noqa: E402
from datacentric.cli.main import main  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402
from datacentric.data.media_sources import read_media_source  # noqa: E402
from datacentric.prepare import PrepareJob, prepare  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: every line break of ``str.splitlines``, commas and quotes, in one caption
EVERY_BREAK = 'a cat\n\r\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029runs, "fast", then, stops'
ROWS = [
    ("a.mp4", EVERY_BREAK),
    ("a.mp4", EVERY_BREAK),  # the same line three times: one sample
    ("a.mp4", EVERY_BREAK),
    ("a.mp4", "the sun sets, over hills"),  # the same clip, another caption: a sample
    ("b.mp4", 'b "quoted"\u2028x'),
    ("fifo.mp4", "a named pipe"),
    ("folder.mp4", "a folder"),
]


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict:
    """The pipeline and a BOM + CRLF CSV of :data:`ROWS`, and one prepare of it."""
    root = tmp_path_factory.mktemp("lists")
    pipe = save_wan_pipeline(root / "pipe")
    folder = root / "media"
    folder.mkdir()
    write_clip(folder / "a.mp4", 5, 16, 16, seed=1)
    write_clip(folder / "b.mp4", 5, 16, 16, seed=2)
    os.mkfifo(folder / "fifo.mp4")
    (folder / "folder.mp4").mkdir()
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\r\n")
    writer.writerows([("path", "caption"), *ROWS])
    listing = folder / "list.csv"
    listing.write_bytes(("\ufeff" + text.getvalue()).encode())
    job = PrepareJob(pipeline=str(pipe), media=str(listing), out=str(root / "out"))
    return {"root": root, "job": job, "report": prepare(job)}


def _manifest(out: Path) -> list[dict]:
    raw = (out / "manifest.jsonl").read_bytes()
    assert len(raw.decode().splitlines()) == raw.count(b"\n")  # no raw U+2028, U+0085
    return [json.loads(line) for line in raw.decode().split("\n") if line]


def test_captions_reach_the_manifest_exactly(media):
    out = Path(media["job"].out)
    found = [(e["source"], e["caption"].encode()) for e in _manifest(out)]
    assert found == [(s, c.encode()) for s, c in (ROWS[0], ROWS[3], ROWS[4])]
    settings = json.loads((out / ".prepare" / "settings.json").read_text())
    assert settings["max_text_tokens"] == 512  # the length used: the pipeline's own


def test_a_repeated_line_is_one_sample_and_not_a_file_is_named(media):
    report = media["report"]
    first = read_media_source(media["job"].media)[0].where
    reasons = {(s["where"].rsplit(":", 1)[1], s["reason"]) for s in report["skipped_files"]}
    lines = [int(w) for w, _ in reasons]
    assert report["samples"] == 3 and report["duplicates"] == 2 and report["skipped"] == 4
    assert {r for _, r in reasons} == {
        f"duplicate of {first} (same path and caption)",
        "not a media file: a FIFO (named pipe)",
        "not a media file: a folder",
    }
    assert len(lines) == 4 and first not in {s["where"] for s in report["skipped_files"]}
    again = prepare(media["job"])
    assert (again["encoded"], again["already_done"], again["samples"]) == (0, 3, 3)


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--world", "0", "--world 0: must be an integer >= 1"),
        ("--max-text-tokens", "0", "--max-text-tokens 0: must be an integer >= 1"),
        ("--max-text-tokens", "-5", "--max-text-tokens -5: must be an integer >= 1"),
        ("--seed", "-1", "--seed -1: must be an integer >= 0"),
    ],
)
def test_settings_out_of_range_are_refused(media, capsys, tmp_path, flag, value, message):
    job = media["job"]
    argv = ["prepare", "--pipeline", job.pipeline, "--media", job.media]
    assert main([*argv, "--out", str(tmp_path / "o"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"datacentric prepare: {message}"]
    assert not (tmp_path / "o").exists()


class _FillingDisk:
    """``open`` whose files share ``room`` bytes, then raise ENOSPC (a disk filling up)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)
        return handle if "w" not in mode else _Filling(handle, self)


class _Filling:
    def __init__(self, handle, disk: _FillingDisk) -> None:
        self.handle, self.disk = handle, disk

    def write(self, data: bytes) -> int:
        fits = data[: max(self.disk.room, 0)]
        self.handle.write(fits)
        self.disk.room -= len(data)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()


def _files(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "prepare_report.json"
    }


def test_a_full_disk_leaves_no_temporary_file_and_a_rerun_finishes(media, monkeypatch):
    job = media["job"]
    out = media["root"] / "full"
    interrupted = PrepareJob(pipeline=job.pipeline, media=job.media, out=str(out))
    # room for the pipeline's empty prompt, the first clip's latent and part of its text:
    # the text write fails
    empty = (Path(job.out) / "empty_prompt.text.safetensors").stat().st_size
    monkeypatch.setattr(prepare_run, "open", _FillingDisk(empty + 20_000), raising=False)
    with pytest.raises(DataError, match=r"latents/[ab]-\w+\.text\.safetensors: no space left"):
        prepare(interrupted)
    monkeypatch.undo()
    assert not list(out.rglob("*.tmp")) and not (out / "manifest.jsonl").exists()
    (out / "latents" / ".a-0.text.safetensors.999.tmp").write_bytes(b"killed mid-write")
    report = prepare(interrupted)
    assert report["samples"] == 3 and not list(out.rglob("*.tmp"))
    assert _files(out) == _files(Path(job.out))


def test_caption_files_and_hugging_face_metadata_reach_the_manifest(media, tmp_path):
    """A ``NAME.txt`` caption (less its final line end) and a ``metadata.jsonl`` line
    holding a raw U+2028 inside its JSON string, each through a whole prepare."""
    job = media["job"]
    clip = Path(job.media).parent / "a.mp4"
    folders = {"txt": tmp_path / "txt", "hf": tmp_path / "hf"}
    for folder in folders.values():
        (folder / "clips").mkdir(parents=True)
        (folder / "clips" / "a.mp4").write_bytes(clip.read_bytes())
    (folders["txt"] / "clips" / "a.txt").write_bytes(EVERY_BREAK.encode() + b"\r\n")
    raw = '{"file_name": "clips/a.mp4", "text": "a\u2028b, \\"c\\"\x85"}\n'
    (folders["hf"] / "metadata.jsonl").write_bytes(raw.encode())
    expected = {"txt": ("clips/a.mp4", EVERY_BREAK), "hf": ("clips/a.mp4", 'a\u2028b, "c"\x85')}
    for kind, folder in folders.items():
        out = tmp_path / f"out-{kind}"
        prepare(PrepareJob(pipeline=job.pipeline, media=str(folder), out=str(out)))
        assert [(e["source"], e["caption"]) for e in _manifest(out)] == [expected[kind]]


def test_another_source_into_the_same_out_names_the_samples_it_no_longer_lists(
    media, tmp_path, capsys
):
    """A second list prepared into a folder that holds the first's samples: the manifest
    lists the second's (what latents:OUT trains on), and the run says how many samples of
    the earlier manifest it no longer lists, and from which --media; it said nothing."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(media["job"].out, out)  # the module's prepare: 3 samples
    other = tmp_path / "more"
    other.mkdir()
    write_clip(other / "c.mp4", 5, 16, 16, seed=3)
    (other / "c.txt").write_text("a third clip")
    pipeline = media["job"].pipeline
    assert main(["prepare", "--pipeline", pipeline, "--media", str(other), "--out", str(out)]) == 0
    said = capsys.readouterr().err
    assert [e["source"] for e in _manifest(out)] == ["c.mp4"]
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["no_longer_listed"] == 3
    earlier = f"(--media {media['job'].media})"
    assert f"prepare: note: 3 samples of the manifest the last run wrote {earlier}" in said
    again = prepare(PrepareJob(pipeline=pipeline, media=str(other), out=str(out)))
    assert again["no_longer_listed"] == 0  # the same source again: nothing dropped
