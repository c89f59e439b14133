"""What ``prepare`` says names what the source holds: a folder of photos is counted in
images, a folder of clips in clips, a mixed one in clips and images (each count with its
own plural), in each line of progress and in the refusal of a source none of whose files
can be encoded (the pipeline's loading and the encoding are stubbed here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prepare_media import write_clip, write_image

from datacentric.data.base import DataError
from datacentric.data.clip_plans import ClipPlan
from datacentric.data.latents import EMPTY_PROMPT
from datacentric.data.media_sources import MediaItem
from datacentric.data.video_geometry import Geometry
from datacentric.prepare import run as prepare_run
from datacentric.prepare.plan import PrepareJob, PreparePlan, Task, plan_prepare

pytestmark = pytest.mark.usefixtures("one_thread")

#: the files of each source -> what each progress line counts them in
SOURCES = {
    "photos": (["a.png", "b.jpg", "c.webp"], "images"),
    "one photo": (["a.png"], "image"),
    "clips": (["a.mp4", "b.webm"], "clips"),
    "mixed": (["a.mp4", "b.png", "c.jpg"], "clips and images"),
}


def _progress_lines(names: list[str], tmp_path: Path, monkeypatch, capsys) -> list[str]:
    """The lines :func:`~datacentric.prepare.run.encode_rank` says encoding ``names``."""
    monkeypatch.setattr(prepare_run, "open_pipeline", lambda *args, **kwargs: None)
    monkeypatch.setattr(prepare_run, "PipelineEncoder", lambda pipe, **kwargs: object())
    monkeypatch.setattr(prepare_run, "_encode_one", lambda *args: {"shape": [1]})
    (tmp_path / prepare_run.STATE / "records").mkdir(parents=True)
    (tmp_path / EMPTY_PROMPT).write_bytes(b"")
    plan = ClipPlan((0,), 16, 16, "1x16x16")  # any plan: the encoding is stubbed
    tasks = [
        Task(MediaItem(k, tmp_path / name, name, "a cat", f"list.csv:{k + 2}"), plan, None)
        for k, name in enumerate(names)
    ]
    monkeypatch.setattr(Task, "key", lambda task: {"source": task.item.source})
    job = PrepareJob(pipeline="pipe", media="list.csv", out=str(tmp_path), device="cpu")
    capsys.readouterr()
    prepare_run.encode_rank(job, PreparePlan(tasks, 1, [0]))
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_each_progress_line_counts_what_the_source_holds(
    source: str, tmp_path, monkeypatch, capsys
) -> None:
    names, unit = SOURCES[source]
    lines = _progress_lines(names, tmp_path, monkeypatch, capsys)
    assert len(lines) == len(names), lines
    for number, line in enumerate(lines, 1):
        pattern = rf"prepare: {number}/{len(names)} {unit}, [\d.]+/s(, .+ left)?"
        assert re.fullmatch(pattern, line), line


def test_a_source_none_of_whose_files_can_be_encoded_is_named_by_its_kind(tmp_path) -> None:
    """Photos under the minimum size: 'none of its 2 images' (it said '2 clips'); with a
    clip too short beside one: 'none of its 3 clips and images'."""
    wan = Geometry(temporal=4, multiple=16)
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("a.png", "b.png"):
        write_image(photos / name, 8, 8)
        (photos / name).with_suffix(".txt").write_text("a cat")
    job = PrepareJob(pipeline="pipe", media=str(photos), out=str(tmp_path / "out"))
    with pytest.raises(DataError, match=r": none of its 2 images can be encoded \(the first"):
        plan_prepare(job, wan, None, 1)
    write_clip(photos / "c.mp4", 3, 16, 16)
    (photos / "c.txt").write_text("a cat")
    with pytest.raises(DataError, match=r": none of its 3 clips and images can be encoded"):
        plan_prepare(job, wan, None, 1)


def test_a_folder_of_uncaptioned_clips_beside_their_list_names_the_list(tmp_path) -> None:
    """``--media clips`` on a folder whose captions are in ``clips/captions.csv`` (as
    ``datacentric tiny`` writes it) says to pass the list, not only 'missing caption'."""
    wan = Geometry(temporal=4, multiple=16)
    clips = tmp_path / "clips"
    clips.mkdir()
    for name in ("a.mp4", "b.mp4"):
        write_clip(clips / name, 5, 16, 16)
    (clips / "captions.csv").write_text("path,text\na.mp4,a cat\nb.mp4,a dog\n")
    job = PrepareJob(pipeline="pipe", media=str(clips), out=str(tmp_path / "out"))
    with pytest.raises(DataError) as err:
        plan_prepare(job, wan, None, 1)
    assert str(err.value).endswith(
        f"missing caption); nothing to prepare: {clips / 'captions.csv'} lists captions, pass "
        "it as --media to read them"
    ), err.value
    (clips / "captions.csv").unlink()
    with pytest.raises(DataError, match=r"missing caption\); nothing to prepare$"):
        plan_prepare(job, wan, None, 1)
