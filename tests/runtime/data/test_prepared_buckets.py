"""One meaning of a bucket: ``--bucket-config`` frames are pixel frames with the VAE
family's own latent-frame rule in ``prepare`` and in ``train``; a prepared latent keeps
every frame it was prepared with, or training is refused before ranks start."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from datacentric.cli.main import main
from datacentric.data.base import DataError
from datacentric.data.bucket_config import BucketConfig
from datacentric.data.clip_plans import clip_rng, plan_clip
from datacentric.data.latents import LatentDataset
from datacentric.data.media_decode import MediaInfo
from datacentric.data.media_sources import MediaItem
from datacentric.data.video_geometry import Geometry
from datacentric.models.diffusers_encode import PIPELINES, pipeline_geometry

#: every pipeline prepare encodes for: its VAE's config, and frames per latent frame
#: after the first as its VAE makes them (Wan's and HunyuanVideo's causal VAEs: 4)
FAMILY_VAES = {
    "WanPipeline": ({"_class_name": "AutoencoderKLWan"}, 4),
    "SkyReelsV2Pipeline": ({"_class_name": "AutoencoderKLWan"}, 4),
    "HunyuanVideoPipeline": (
        {"temporal_compression_ratio": 4, "spatial_compression_ratio": 8},
        4,
    ),
    "FluxPipeline": ({"block_out_channels": [8, 8, 8, 8]}, 1),
}
#: pixel frames per bucket, at one size; the 33-frame bucket keeps half its clips
BUCKETS = {
    "buckets": {"small": {"1": 1.0, "9": 1.0, "17": 1.0, "33": 0.5, "51": 1.0}},
    "aspect_ratios": {"small": {"0.71": [32, 48]}},
}
#: source clips: frames (1: an image)
LENGTHS = (1, 1, 9, 12, 17, 20, 35, 36, 40, 49, 60, 70)


def _geometry(tmp_path, pipeline: str) -> Geometry:
    config, _ = FAMILY_VAES[pipeline]
    folder = tmp_path / pipeline
    (folder / "vae").mkdir(parents=True)
    (folder / "vae" / "config.json").write_text(json.dumps(config))
    index = {"_class_name": pipeline, "vae": ["diffusers", "AutoencoderKL"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    return Geometry(*pipeline_geometry(folder))


def _prepared_folder(tmp_path, pipeline: str, buckets_file) -> tuple:
    """Plan every clip of :data:`LENGTHS` as ``prepare`` does and write latents of the
    shape the family's VAE makes, with ``prepare``'s manifest lines; the frames each
    kept latent has."""
    geometry = _geometry(tmp_path, pipeline)
    temporal = FAMILY_VAES[pipeline][1]
    buckets = BucketConfig.load(str(buckets_file))
    out = tmp_path / f"{pipeline}-latents"
    (out / "latents").mkdir(parents=True)
    lines, kept = [], []
    for number, frames in enumerate(LENGTHS):
        is_image = frames == 1
        if pipeline == "FluxPipeline" and not is_image:
            continue
        item = MediaItem(number, out / f"c{number}.mp4", f"c{number}.mp4", "a cat", "x")
        rng = clip_rng(item, 0)
        plan = plan_clip(
            MediaInfo(frames, 40, 56), geometry, is_image=is_image, buckets=buckets, rng=rng
        )
        if isinstance(plan, str):
            continue
        latent_frames = 1 + (len(plan.frames) - 1) // temporal
        shape = (latent_frames, 4, plan.height // 8, plan.width // 8)
        save_file({"latent": torch.randn(shape)}, out / "latents" / f"c{number}.safetensors")
        entry = {"latent": f"latents/c{number}.safetensors", "source": item.source}
        lines.append(json.dumps({**entry, "frames": len(plan.frames), "bucket": plan.bucket}))
        kept.append(latent_frames)
    (out / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return out, kept


@pytest.mark.parametrize("pipeline", list(FAMILY_VAES))
def test_the_same_bucket_config_keeps_every_prepared_frame(tmp_path, pipeline):
    assert set(FAMILY_VAES) == set(PIPELINES)
    config = tmp_path / "buckets.json"
    config.write_text(json.dumps(BUCKETS))
    out, kept = _prepared_folder(tmp_path, pipeline, config)
    dataset = LatentDataset(str(out), bucket_config=str(config))
    assert len(dataset) == len(kept) and dataset.skipped == []
    assert [dataset.grid(i)[0] for i in range(len(dataset))] == kept
    for i in range(len(dataset)):
        assert dataset.sample(i).x0.shape[0] == kept[i] * 2 * 3  # whole 1 x 2 x 2 patches
    if pipeline != "FluxPipeline":
        # 49 pixel frames -> 13 latent frames (Open-Sora's rule read 49 as 14, a 51-frame
        # bucket as 15 latent frames); 9 -> 3 (Open-Sora: 2)
        assert 13 in kept and 3 in kept


def test_a_bucket_that_would_cut_a_prepared_latent_is_refused_before_ranks(tmp_path, capsys):
    config = tmp_path / "buckets.json"
    config.write_text(json.dumps(BUCKETS))
    out, _ = _prepared_folder(tmp_path, "WanPipeline", config)
    shorter = tmp_path / "shorter.json"
    shorter.write_text(json.dumps({**BUCKETS, "buckets": {"small": {"1": 1.0, "9": 1.0}}}))
    with pytest.raises(
        DataError,
        match=r"manifest.jsonl:5: c4.safetensors was prepared from 17 frames.*bucket small-0.71-9f",
    ):
        LatentDataset(str(out), bucket_config=str(shorter))
    argv = ["train", "--dataset", f"latents:{out}", "--bucket-config", str(shorter)]
    assert main([*argv, "--iterations", "1", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bucket small-0.71-9f" in err[0] and "prepared from" in err[0]
    assert not (tmp_path / "run").exists()
