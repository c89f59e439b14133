"""``prepare`` for Flux (PNG images, a folder with ``NAME.txt`` captions) and
HunyuanVideo (clips listed in JSONL): latents and ``(1 + L) x D`` text files equal the
pipeline's own VAE mode and ``encode_prompt`` (pooled projection in row 0, the rows its
mask drops zero), and ``train --world 2`` trains on them."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_json_here
from prepare_media import (
    decoded_frames,
    save_flux_pipeline,
    save_hunyuan_pipeline,
    write_clip,
    write_image,
)

pytest.importorskip("diffusers")
pytest.importorskip("av")

from safetensors.torch import load_file  # noqa: E402

from datacentric.prepare import PrepareJob, prepare  # noqa: E402

CAPTIONS = ["a cat walks on the grass", "red car drives past green trees", "birds flying"]


def _train(pipe_dir, out, run, capsys) -> dict:
    """``train --world 2`` in this process (the ranks are spawned from it): its summary."""
    args = ["train", "--model", f"diffusers:{pipe_dir}", "--dataset", f"latents:{out}"]
    args += ["--world", "2", "--iterations", "1", "--cost-model", "analytic", "--no-progress"]
    return cli_json_here([*args, "--out", str(run), "--json"], capsys)


def _pooled_layout(embeds: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    row = embeds.new_zeros(1, embeds.shape[-1])
    row[0, : pooled.numel()] = pooled
    return torch.cat([row, embeds])


@pytest.mark.slow
def test_flux_images_from_a_caption_folder(tmp_path, capsys):
    from diffusers import FluxPipeline
    from PIL import Image

    pipe_dir = save_flux_pipeline(tmp_path / "flux")
    media = tmp_path / "images"
    media.mkdir()
    sizes = {"one.png": (48, 64), "two.png": (64, 48), "three.png": (80, 88)}
    for number, ((name, (h, w)), caption) in enumerate(zip(sizes.items(), CAPTIONS)):
        write_image(media / name, h, w, seed=number)
        (media / name).with_suffix(".txt").write_text(caption)
    out = tmp_path / "out"
    report = prepare(PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(out), world=2))
    assert report["samples"] == 3 and report["skipped"] == 0
    pipe = FluxPipeline.from_pretrained(pipe_dir, local_files_only=True)
    config = pipe.vae.config
    for line in (out / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        h, w = sizes[entry["source"]]
        h, w = h // 16 * 16, w // 16 * 16
        image = Image.open(media / entry["source"]).convert("RGB")
        with torch.no_grad():
            pixels = pipe.image_processor.preprocess(image, height=h, width=w, resize_mode="crop")
            z = pipe.vae.encode(pixels).latent_dist.mode()
            embeds, pooled, _ = pipe.encode_prompt(entry["caption"], prompt_2=None)
        want = ((z - config.shift_factor) * config.scaling_factor)[0].unsqueeze(0)
        got = load_file(out / entry["latent"])["latent"]
        assert got.shape == (1, 4, h // 8, w // 8)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        text = load_file(out / entry["text"])["text"]
        assert text.shape == (1 + 512, 32)
        torch.testing.assert_close(text, _pooled_layout(embeds[0], pooled[0]), rtol=0, atol=1e-5)
    trained = _train(pipe_dir, out, tmp_path / "run", capsys)
    assert trained["iterations_done"] == 1 and trained["samples_seen"] >= 1


@pytest.mark.slow
def test_hunyuan_video_clips_from_jsonl(tmp_path, capsys):
    from diffusers import HunyuanVideoPipeline

    pipe_dir = save_hunyuan_pipeline(tmp_path / "hunyuan")
    media = tmp_path / "clips"
    media.mkdir()
    clips = {"a.mp4": (9, 32, 48), "b.mp4": (13, 48, 32), "c.mp4": (5, 32, 32)}
    lines = []
    for number, ((name, shape), caption) in enumerate(zip(clips.items(), CAPTIONS)):
        write_clip(media / name, *shape, seed=number)
        lines.append(json.dumps({"path": name, "caption": caption}))
    (media / "list.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    job = PrepareJob(pipeline=str(pipe_dir), media=str(media / "list.jsonl"), out=str(out), world=2)
    assert prepare(job)["samples"] == 3
    pipe = HunyuanVideoPipeline.from_pretrained(pipe_dir, local_files_only=True)
    for line in (out / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        frames, h, w = clips[entry["source"]]
        video = decoded_frames(media / entry["source"])[:frames]
        with torch.no_grad():
            pixels = pipe.video_processor.preprocess_video(
                video, height=h, width=w, resize_mode="crop"
            )
            z = pipe.vae.encode(pixels).latent_dist.mode() * pipe.vae.config.scaling_factor
            embeds, pooled, mask = pipe.encode_prompt(entry["caption"], prompt_2=None)
        got = load_file(out / entry["latent"])["latent"]
        torch.testing.assert_close(got, z[0].permute(1, 0, 2, 3), rtol=0, atol=1e-5)
        text = load_file(out / entry["text"])["text"]
        masked = embeds[0] * mask[0].unsqueeze(-1).to(embeds.dtype)
        assert text.shape == (1 + 256, 32) and 0 < int(mask.sum()) < 256
        torch.testing.assert_close(text, _pooled_layout(masked, pooled[0]), rtol=0, atol=1e-5)
    trained = _train(pipe_dir, out, tmp_path / "run", capsys)
    assert trained["iterations_done"] == 1 and trained["samples_seen"] >= 1
