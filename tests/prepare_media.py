"""Tiny diffusers pipelines (random weights, tokenizers trained here) and generated media
for the ``prepare`` tests. Nothing is downloaded.

Clips are written with PyAV in a lossless RGB codec (H.264 RGB at ``crf 0``), so any
decoder returns the pixels written; images with Pillow.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from datacentric.cli import tiny
from datacentric.cli.tiny import T5_SIZES  # the 2-layer T5/umT5 of `datacentric tiny`

WORDS = (
    "a cat walks on the grass under blue sky while red car drives past green trees and "
    "the sun sets over hills with birds flying slowly near water"
)


def word_tokenizer(model_max_length: int = 512, bos: bool = False):
    """A word-level fast tokenizer of :data:`WORDS` (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2)
    that appends ``</s>`` as T5's does (and prepends ``<s>`` with ``bos``)."""
    return tiny.word_tokenizer(model_max_length, bos, words=WORDS.split())


def save_wan_pipeline(folder: Path, seed: int = 0) -> Path:
    """A tiny ``WanPipeline`` (umT5 of width 32, a 4-channel Wan VAE, the tiny Wan
    transformer) saved with ``save_pretrained``."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.5, 2.0, 1.0],
    )
    tokenizer = word_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(**T5_SIZES, vocab_size=len(tokenizer)))
    transformer = WanTransformer3DModel.from_config(TINY_DIFFUSERS["wan"][1])
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.save_pretrained(folder)
    return folder


def write_clip(path: Path, frames: int, height: int, width: int, seed: int = 0) -> Path:
    """A clip of smooth random colour waves, lossless RGB H.264, written with PyAV."""
    import av

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6.28, size=(3,))
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264rgb", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        stream.options = {"crf": "0", "preset": "ultrafast"}
        for t in range(frames):
            channels = [
                127.5 + 120 * np.sin(x / (5 + c) + y / (7 + c) + t * 0.3 + phase[c])
                for c in range(3)
            ]
            pixels = np.stack(channels, axis=-1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_media(folder: Path, clips: list[tuple[str, int, int, int, str]]) -> Path:
    """Clips ``(name, frames, height, width, caption)`` and a ``captions.csv`` listing
    them (Open-Sora's ``path,text`` columns); returns the CSV."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for number, (name, frames, height, width, caption) in enumerate(clips):
        write_clip(folder / name, frames, height, width, seed=number)
        rows.append({"path": name, "text": caption})
    listing = folder / "captions.csv"
    with open(listing, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "text"])
        writer.writeheader()
        writer.writerows(rows)
    return listing


def decoded_frames(path: Path) -> list:
    """Every frame of a clip as an RGB ``PIL.Image``, decoded with PyAV here."""
    import av
    from PIL import Image

    with av.open(str(path)) as container:
        return [
            Image.fromarray(frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)
        ]


def _clip_text_encoder(vocab: int, width: int = 16):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=width,
        bos_token_id=3,
        eos_token_id=1,
        pad_token_id=0,
    )
    return CLIPTextModel(config)


def save_flux_pipeline(folder: Path, seed: int = 0) -> Path:
    """A tiny ``FluxPipeline``: CLIP (width 16, its pooled projection) and T5 (width 32)
    text encoders, a 4-channel VAE of 8x down-sampling, the tiny Flux transformer."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import T5Config, T5EncoderModel

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    torch.manual_seed(seed)
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        shift_factor=0.1159,
        scaling_factor=0.3611,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    clip_tokenizer = word_tokenizer(77, bos=True)
    t5_tokenizer = word_tokenizer(512)
    t5 = T5EncoderModel(T5Config(**T5_SIZES, vocab_size=len(t5_tokenizer)))
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=_clip_text_encoder(len(clip_tokenizer)),
        tokenizer=clip_tokenizer,
        text_encoder_2=t5,
        tokenizer_2=t5_tokenizer,
        transformer=FluxTransformer2DModel.from_config(TINY_DIFFUSERS["flux"][1]),
    )
    pipe.save_pretrained(folder)
    return folder


def save_hunyuan_pipeline(folder: Path, seed: int = 0) -> Path:
    """A tiny ``HunyuanVideoPipeline``: a 2-layer Llama (width 32) and CLIP (width 16)
    text encoders, a 4-channel HunyuanVideo VAE, the tiny HunyuanVideo transformer."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import LlamaConfig, LlamaModel

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    llama_tokenizer = word_tokenizer(512, bos=True)
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=len(llama_tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=3,
            eos_token_id=1,
        )
    )
    clip_tokenizer = word_tokenizer(77, bos=True)
    pipe = HunyuanVideoPipeline(
        text_encoder=llama,
        tokenizer=llama_tokenizer,
        transformer=HunyuanVideoTransformer3DModel.from_config(TINY_DIFFUSERS["hunyuan-video"][1]),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder_2=_clip_text_encoder(len(clip_tokenizer)),
        tokenizer_2=clip_tokenizer,
    )
    pipe.save_pretrained(folder)
    return folder


def write_image(path: Path, height: int, width: int, seed: int = 0) -> Path:
    """An RGB PNG of smooth random colour waves, written with Pillow."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6.28, size=(3,))
    channels = [127.5 + 120 * np.sin(x / (4 + c) + y / (6 + c) + phase[c]) for c in range(3)]
    Image.fromarray(np.stack(channels, axis=-1).astype(np.uint8)).save(path)
    return path
