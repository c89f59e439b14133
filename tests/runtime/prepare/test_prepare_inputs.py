"""What ``prepare`` decides before encoding: media lists and their paths, each clip's
frames and size with and without a bucket config, the caption rule, and a pipeline
folder whose components would run code (all without loading an encoder)."""

from __future__ import annotations

import json

import pytest
from prepare_media import word_tokenizer, write_clip

pytest.importorskip("av")

from datacentric.data.base import DataError  # noqa: E402
from datacentric.data.bucket_config import BucketConfig  # noqa: E402
from datacentric.data.clip_plans import plan_clip  # noqa: E402
from datacentric.data.frame_sampling import even_frames  # noqa: E402
from datacentric.data.media_decode import MediaInfo  # noqa: E402
from datacentric.data.media_sources import read_media_source  # noqa: E402
from datacentric.data.video_geometry import Geometry  # noqa: E402
from datacentric.models.diffusers_encode import (  # noqa: E402
    CaptionLength,
    PipelineError,
    pipeline_geometry,
    read_model_index,
)
from datacentric.prepare.plan import PrepareJob, plan_prepare  # noqa: E402

WAN = Geometry(temporal=4, multiple=16)


def test_media_list_paths_stay_in_their_folder(tmp_path):
    (tmp_path / "list").mkdir()
    for bad in ("../outside.mp4", str(tmp_path / "abs.mp4")):
        (tmp_path / "list" / "c.csv").write_text(f"path,text\n{bad},a caption\n")
        with pytest.raises(DataError, match="outside the list's folder"):
            read_media_source(tmp_path / "list" / "c.csv")
    # an absolute path inside the folder is not said to be outside it: its relative spelling
    (tmp_path / "list" / "c.csv").write_text(f"path,text\n{tmp_path}/list/sub/a.mp4,a\n")
    with pytest.raises(DataError) as err:
        read_media_source(tmp_path / "list" / "c.csv")
    folder = (tmp_path / "list").resolve()
    assert str(err.value) == (
        f"{tmp_path}/list/c.csv:2: path '{tmp_path}/list/sub/a.mp4' is absolute; paths in a "
        f"media list are relative to the list's folder {folder}: write it as 'sub/a.mp4'"
    )
    (tmp_path / "list" / "c.jsonl").write_text('{"video": "a.mp4", "prompt": "x"}\n{"path": 3\n')
    with pytest.raises(DataError, match=r"c.jsonl:2: not JSON"):
        read_media_source(tmp_path / "list" / "c.jsonl")


def test_folder_captions_beside_each_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.mp4").write_bytes(b"")
    (tmp_path / "sub" / "a.txt").write_text("  a caption \n")
    (tmp_path / "b.png").write_bytes(b"")
    items = read_media_source(tmp_path)
    assert [(i.source, i.caption, i.is_image) for i in items] == [
        ("b.png", None, True),
        ("sub/a.mp4", "  a caption ", False),  # as written, less the final line end
    ]
    assert items[0].name != items[1].name and items[1].name.startswith("a-")


def test_each_clip_gets_frames_and_size_the_vae_takes():
    # no bucket config: the first 4k + 1 frames, the size rounded down to 16 pixels
    plan = plan_clip(MediaInfo(14, 50, 70), WAN, is_image=False)
    assert (plan.frames, plan.height, plan.width) == (tuple(range(13)), 48, 64)
    assert plan_clip(MediaInfo(4, 64, 64), WAN, is_image=False).startswith("too short")
    assert plan_clip(MediaInfo(1, 8, 40), WAN, is_image=True).startswith("too small")
    assert plan_clip(MediaInfo(1, 40, 40), WAN, is_image=True).frames == (0,)
    buckets = BucketConfig(
        {
            "buckets": {"big": {"9": 1.0, "5": 1.0, "1": 1.0}, "small": {"5": 1.0}},
            "aspect_ratios": {"big": {"0.75": [48, 64]}, "small": {"1.00": [32, 32]}},
        }
    )
    plan = plan_clip(MediaInfo(14, 50, 70), WAN, is_image=False, buckets=buckets)
    assert plan.bucket == "big-0.75-9f" and (plan.height, plan.width) == (48, 64)
    assert plan.frames == even_frames(14, 9) == (0, 2, 3, 5, 6, 8, 10, 11, 13)
    plan = plan_clip(MediaInfo(14, 40, 40), WAN, is_image=False, buckets=buckets)
    assert plan.bucket == "small-1.00-5f" and plan.frames == (0, 3, 6, 10, 13)
    assert plan_clip(MediaInfo(1, 50, 70), WAN, is_image=True, buckets=buckets).bucket == (
        "big-0.75-1f"
    )
    never = BucketConfig(
        {"buckets": {"big": {"9": 0.0}}, "aspect_ratios": {"big": {"0.75": [48, 64]}}}
    )
    assert plan_clip(MediaInfo(14, 50, 70), WAN, is_image=False, buckets=never).startswith(
        "no bucket"
    )


def _pipeline_folder(tmp_path, extra: dict | None = None):
    """A pipeline folder with what planning reads: model_index.json, the tokenizer and
    the VAE's config (no weights: no encoder is loaded by planning)."""
    folder = tmp_path / "pipe"
    word_tokenizer().save_pretrained(folder / "tokenizer")
    (folder / "vae").mkdir()
    (folder / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan"}))
    index = {
        "_class_name": "WanPipeline",
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        **(extra or {}),
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_caption_rules(tmp_path):
    folder = _pipeline_folder(tmp_path)
    assert pipeline_geometry(folder) == (4, 16)
    media = tmp_path / "media"
    media.mkdir()
    for name in ("ok", "long", "empty"):
        write_clip(media / f"{name}.mp4", 5, 16, 16)
    long_caption = "a cat walks on the grass under blue sky"  # 9 words + </s>
    rows = ["path,text", "ok.mp4,a cat", f"long.mp4,{long_caption}", "empty.mp4,"]
    (media / "list.csv").write_text("\n".join(rows) + "\n")
    tokens = CaptionLength(folder, limit=8)
    assert tokens(long_caption) == 10

    def plan(rule: str):
        job = PrepareJob(pipeline=str(folder), media=str(media / "list.csv"), out="x")
        job = PrepareJob(**{**job.__dict__, "caption_rule": rule})
        return {t.item.source: t for t in plan_prepare(job, WAN, tokens, 2).tasks}

    tasks = plan("truncate")
    assert tasks["long.mp4"].truncate and tasks["long.mp4"].plan is not None
    assert tasks["empty.mp4"].skip == "empty caption" and tasks["ok.mp4"].skip is None
    assert plan("skip")["long.mp4"].skip == "caption of 10 tokens, over 8"
    with pytest.raises(DataError, match=r"list.csv:3: caption of 10 tokens"):
        plan("error")


def test_a_component_from_another_library_is_refused_before_anything_loads(tmp_path):
    folder = _pipeline_folder(tmp_path, {"text_encoder": ["evil_module", "Encoder"]})
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder" / "evil_module.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n"
    )
    with pytest.raises(PipelineError, match="only diffusers and transformers classes"):
        read_model_index(folder)
    with pytest.raises(PipelineError):
        CaptionLength(folder)
    assert not (tmp_path / "ran").exists()


def test_a_wrong_out_folder_is_refused_before_the_media_are_read(tmp_path, monkeypatch):
    """A non-empty ``--out`` prepare did not make, or one it made with other settings,
    is refused before every file's header is read (minutes for a large folder); no
    folder is made for a source that is then refused."""
    from types import SimpleNamespace

    from datacentric.prepare import run as prepare_run

    def read_media(*args):
        raise AssertionError("the media were read before --out was checked")

    monkeypatch.setattr(prepare_run, "pipeline_geometry", lambda folder: (4, 16))
    monkeypatch.setattr(prepare_run, "CaptionLength", lambda *a: SimpleNamespace(limit=8))
    monkeypatch.setattr(prepare_run, "plan_prepare", read_media)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    job = PrepareJob(pipeline="pipe", media="media", out=str(theirs))
    with pytest.raises(DataError, match="a non-empty folder that prepare did not make"):
        prepare_run.prepare(job)
    made = PrepareJob(pipeline="pipe", media="media", out=str(tmp_path / "made"))
    prepare_run.claim_folder(PrepareJob(**{**made.__dict__, "seed": 1}))
    with pytest.raises(DataError) as refused:  # said "(max_text_tokens, seed differ)"
        prepare_run.prepare(made)
    assert str(refused.value) == (
        f"--out {tmp_path / 'made'}: prepared with other settings: max_text_tokens "
        "(None -> 8), seed (1 -> 0); choose a new --out, or the same settings to resume"
    )
    table = tmp_path / "buckets.json"
    table.write_text("{}")
    with pytest.raises(DataError, match=r": bucket_config \(none -> sha256 44136fa355b3\), "):
        prepare_run.claim_folder(PrepareJob(**{**made.__dict__, "bucket_config": str(table)}))
    with pytest.raises(AssertionError, match="the media were read"):
        prepare_run.prepare(PrepareJob(**{**made.__dict__, "out": str(tmp_path / "new")}))
    assert not (tmp_path / "new").exists()
