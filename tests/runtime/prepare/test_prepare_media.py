"""Clips as users have them: every container and codec the decoder reads, frame counts
from the stream or from decoding."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from media_formats import FORMATS, write_format_clip
from prepare_media import decoded_frames, save_wan_pipeline

pytest.importorskip("diffusers")
pytest.importorskip("av")

from safetensors.torch import load_file  # noqa: E402

from datacentric.data.media_decode import MediaError, decode, probe  # noqa: E402
from datacentric.data.media_sources import MediaItem  # noqa: E402
from datacentric.prepare import PrepareJob, prepare  # noqa: E402

#: file -> frames written (17 in Matroska and WebM, which keep no per-stream count)
LENGTHS = {
    "ffv1.mkv": 17,
    "vp9.webm": 17,
    "mpeg4.avi": 9,
    "h264.mov": 13,
    "audio_first.mp4": 9,
    "anim.gif": 5,
    "vp8.webm": 7,
    "av1.mp4": 6,
}


def _item(path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory):
    """A tiny ``WanPipeline`` folder, shared by the tests of this file."""
    return save_wan_pipeline(tmp_path_factory.mktemp("pipe") / "pipe")


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    for number, (name, frames) in enumerate(LENGTHS.items()):
        write_format_clip(folder / name, frames, 32, 48, seed=number)
        (folder / name).with_suffix(".txt").write_text("a cat walks on the grass")
    return folder


def test_every_container_gives_its_decoded_frame_count(media):
    import av

    assert set(LENGTHS) == set(FORMATS)
    with av.open(str(media / "audio_first.mp4")) as container:
        assert [s.type for s in container.streams] == ["audio", "video"]
    for name, frames in LENGTHS.items():
        info = probe(_item(media / name))
        assert (info.frames, info.height, info.width) == (frames, 32, 48)
        got = decode(_item(media / name))
        assert len(got) == frames and got[0].size == (48, 32), name
        want = decoded_frames(media / name)
        assert all((a.tobytes() == b.tobytes()) for a, b in zip(got, want)), name


def test_a_skipped_clip_names_its_true_reason(media, tmp_path):
    import av

    with av.open(str(tmp_path / "sound.mp4"), "w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            torch.zeros(1, 1024).numpy(), format="fltp", layout="mono"
        )
        frame.sample_rate, frame.pts = 8000, 0
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    with pytest.raises(MediaError, match="no video stream \\(audio streams only\\)"):
        probe(_item(tmp_path / "sound.mp4"))
    # a Matroska clip cut in half: the frames that still decode are its length
    data = (media / "ffv1.mkv").read_bytes()
    (tmp_path / "cut.mkv").write_bytes(data[: len(data) // 2])
    assert 0 < probe(_item(tmp_path / "cut.mkv")).frames < 17
    (tmp_path / "junk.mkv").write_bytes(b"\x1a\x45\xdf\xa3" + bytes(300))
    with pytest.raises(MediaError, match="corrupt or unreadable video"):
        probe(_item(tmp_path / "junk.mkv"))
    with pytest.raises(MediaError, match="only 17 frames decode, 21 wanted"):
        decode(_item(media / "ffv1.mkv"), list(range(21)))


def test_every_container_is_prepared(media, pipe_dir, tmp_path):
    from diffusers import WanPipeline

    report = prepare(PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(tmp_path / "o")))
    assert report["skipped_files"] == [] and report["samples"] == len(LENGTHS)
    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    for line in (tmp_path / "o" / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        kept = (LENGTHS[entry["source"]] - 1) // 4 * 4 + 1
        video = decoded_frames(media / entry["source"])[:kept]
        pixels = pipe.video_processor.preprocess_video(
            video, height=32, width=48, resize_mode="crop"
        )
        with torch.no_grad():
            want = ((vae.encode(pixels).latent_dist.mode() - mean) / std)[0].permute(1, 0, 2, 3)
        got = load_file(tmp_path / "o" / entry["latent"])["latent"]
        assert got.shape == (1 + (kept - 1) // 4, 4, 4, 6), entry["source"]
        assert (entry["frames"], entry["bucket"]) == (kept, f"{kept}x32x48")
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _vae_latent(pipe, frames, height: int, width: int) -> torch.Tensor:
    """The Wan VAE's normalised mode of ``frames`` as the pipeline preprocesses them."""
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    pixels = pipe.video_processor.preprocess_video(
        frames, height=height, width=width, resize_mode="crop"
    )
    with torch.no_grad():
        return ((vae.encode(pixels).latent_dist.mode() - mean) / std)[0].permute(1, 0, 2, 3)


def test_phone_photos_and_portrait_clips_are_encoded_upright(pipe_dir, tmp_path):
    import numpy as np
    from diffusers import WanPipeline
    from PIL import Image

    media = tmp_path / "media"
    media.mkdir()
    # stored 32 x 48; EXIF orientation 6: shown turned 90 degrees clockwise, 48 x 32
    stored = np.stack([*np.meshgrid(np.arange(48), np.arange(32)), np.zeros((32, 48))], -1)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray((stored * 5).astype(np.uint8)).save(media / "phone.jpg", exif=exif)
    # clips stored 32 x 48 with a display matrix: turned 90 degrees counter-clockwise;
    # mirrored left-right; turned, then mirrored
    write_format_clip(media / "portrait.mp4", 9, 32, 48, rotation=90)
    write_format_clip(media / "mirror.mp4", 5, 32, 48, seed=1, hflip=True)
    write_format_clip(media / "both.mp4", 5, 32, 48, seed=2, rotation=90, hflip=True)
    # the references turn the stored pixels with numpy, from the header's own words
    with Image.open(media / "phone.jpg") as image:
        stored_photo = np.asarray(image.convert("RGB"))
    upright = {
        "phone.jpg": [np.rot90(stored_photo, k=-1)],
        "portrait.mp4": [
            np.rot90(np.asarray(f), k=1) for f in decoded_frames(media / "portrait.mp4")
        ],
        "mirror.mp4": [np.fliplr(np.asarray(f)) for f in decoded_frames(media / "mirror.mp4")],
        "both.mp4": [
            np.fliplr(np.rot90(np.asarray(f), k=1)) for f in decoded_frames(media / "both.mp4")
        ],
    }
    for name, frames in upright.items():
        (media / name).with_suffix(".txt").write_text("a cat walks on the grass")
        info = probe(_item(media / name))
        assert (info.height, info.width, info.rotated) == (*frames[0].shape[:2], True), name
        got = [np.asarray(f) for f in decode(_item(media / name))]
        assert len(got) == len(frames) and all(map(np.array_equal, got, frames)), name

    report = prepare(PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(tmp_path / "o")))
    assert report["samples"] == 4 and report["rotated"] == 4
    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    for line in (tmp_path / "o" / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        frames = [Image.fromarray(np.ascontiguousarray(f)) for f in upright[entry["source"]]]
        h, w = frames[0].height, frames[0].width
        got = load_file(tmp_path / "o" / entry["latent"])["latent"]
        assert got.shape == (1 + (len(frames) - 1) // 4, 4, h // 8, w // 8), entry["source"]
        torch.testing.assert_close(got, _vae_latent(pipe, frames, h, w), rtol=0, atol=1e-5)


def test_an_iphone_heic_photo_is_encoded_upright_in_its_colours(pipe_dir, tmp_path):
    """A HEIC as iPhones write it (turned 90 degrees clockwise by its container's ``irot``
    and by EXIF's entry alike, a Display P3 profile) is encoded by ``prepare`` as the
    Wan VAE encodes its upright picture: a PNG of the same pixels and profile, converted
    to sRGB, turned once with numpy (the HEIC is lossless: exactly those pixels)."""
    import numpy as np
    from diffusers import WanPipeline
    from media_formats import display_p3_profile, wave_frames, write_oriented_photo
    from PIL import Image

    pytest.importorskip("pillow_heif")
    media = tmp_path / "media"
    media.mkdir()
    stored, profile = wave_frames(1, 64, 96)[0], display_p3_profile()
    stored[:12, :20] = 255  # a white corner: no turn or mirror leaves the picture the same
    photo = write_oriented_photo(
        media / "IMG_0001.HEIC", stored, 6, container=True, exif=True, icc_profile=profile
    )
    photo.with_suffix(".txt").write_text("a cat walks on the grass")
    Image.fromarray(stored).save(tmp_path / "same.png", icc_profile=profile)
    (shown,) = decode(_item(tmp_path / "same.png"))
    upright = Image.fromarray(np.ascontiguousarray(np.rot90(np.asarray(shown), k=-1)))

    report = prepare(PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(tmp_path / "o")))
    assert report["samples"] == 1 and not report["skipped_files"]
    (line,) = (tmp_path / "o" / "manifest.jsonl").read_text().splitlines()
    got = load_file(tmp_path / "o" / json.loads(line)["latent"])["latent"]
    assert got.shape == (1, 4, 96 // 8, 64 // 8)
    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    torch.testing.assert_close(got, _vae_latent(pipe, [upright], 96, 64), rtol=0, atol=1e-5)


def _frame_times(path) -> list:
    """Every frame's timestamp in seconds, exact, as the decoder gives them."""
    import av

    with av.open(str(path)) as container:
        return [f.pts * f.time_base for f in container.decode(video=0)]


def test_target_fps_and_sliding_windows_make_the_documented_samples(pipe_dir, tmp_path):
    from fractions import Fraction

    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    media = tmp_path / "media"
    media.mkdir()
    write_format_clip(media / "thirty.mp4", 40, 32, 32, rate=30)
    write_format_clip(media / "long.mp4", 29, 32, 32, rate=8, seed=1)
    for name in ("thirty.mp4", "long.mp4"):
        (media / name).with_suffix(".txt").write_text("a cat walks on the grass")
    frames = {name: decoded_frames(media / name) for name in ("thirty.mp4", "long.mp4")}

    # target_fps 16: output frame i is the frame nearest i / 16 s after the first
    times = _frame_times(media / "thirty.mp4")
    nearest, i = [], 0
    while Fraction(i, 16) <= times[-1] - times[0]:
        goal = times[0] + Fraction(i, 16)
        nearest.append(min(range(len(times)), key=lambda j: (abs(times[j] - goal), j)))
        i += 1
    assert len(nearest) == 21  # 1.3 s at 16 fps; 21 = 4 x 5 + 1 frames, all kept
    job = PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(tmp_path / "fps"))
    report = prepare(dataclasses.replace(job, target_fps=16))
    entries = {
        e["source"]: e
        for e in map(json.loads, (tmp_path / "fps" / "manifest.jsonl").read_text().splitlines())
    }
    assert report["samples"] == 2 and entries["thirty.mp4"]["frames"] == 21
    got = load_file(tmp_path / "fps" / entries["thirty.mp4"]["latent"])["latent"]
    want = _vae_latent(pipe, [frames["thirty.mp4"][j] for j in nearest], 32, 32)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    settings = json.loads((tmp_path / "fps" / ".prepare" / "settings.json").read_text())
    assert settings["target_fps"] == 16 and settings["frame_extraction"] is None

    # slide, 3 windows of at most 9 frames over the 29-frame clip: starts 0, 10, 20
    slide = dataclasses.replace(
        job, out=str(tmp_path / "slide"), frame_extraction="slide", windows=3, max_frames=9
    )
    report = prepare(slide)
    lines = (tmp_path / "slide" / "manifest.jsonl").read_text().splitlines()
    long = [e for e in map(json.loads, lines) if e["source"] == "long.mp4"]
    assert report["samples"] == 6 and [e["frame_range"] for e in long] == [
        [0, 9],
        [10, 19],
        [20, 29],
    ]
    assert len({e["latent"] for e in long}) == 3 and len({e["text"] for e in long}) == 1
    for entry in long:
        start, stop = entry["frame_range"]
        got = load_file(tmp_path / "slide" / entry["latent"])["latent"]
        want = _vae_latent(pipe, frames["long.mp4"][start:stop], 32, 32)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_bucket_config_keeps_every_prepared_frame_in_training(media, pipe_dir, tmp_path):
    from datacentric.data.latents import LatentDataset

    config = tmp_path / "buckets.json"
    buckets = {"small": {"1": 1.0, "5": 1.0, "9": 1.0, "13": 0.5, "17": 1.0}}
    config.write_text(
        json.dumps({"buckets": buckets, "aspect_ratios": {"small": {"0.67": [32, 48]}}})
    )
    out = tmp_path / "o"
    job = PrepareJob(
        pipeline=str(pipe_dir), media=str(media), out=str(out), bucket_config=str(config)
    )
    report = prepare(job)
    entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert report["samples"] == len(entries) >= 5
    dataset = LatentDataset(str(out), bucket_config=str(config))
    assert len(dataset) == len(entries) and dataset.skipped == []
    for i, entry in enumerate(entries):
        latent = load_file(out / entry["latent"])["latent"]
        assert latent.shape[0] == 1 + (entry["frames"] - 1) // 4
        assert dataset.grid(i)[0] == latent.shape[0], entry  # every latent frame trained
        assert dataset.bucket_names[i] == entry["bucket"]
