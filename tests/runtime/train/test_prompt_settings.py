"""Per-prompt render settings in a JSONL prompts file (``height``, ``width``,
``num_frames``, ``negative_prompt``, ``seed``; the ``[validation]`` section's are the
defaults): each prompt renders at its own size, and plain diffusers, called with the
documented generator (:func:`render_generator`) and a run's exported LoRA, writes the
run's validation files byte for byte."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from prepare_media import save_wan_pipeline

from datacentric.data.base import DataError, sample_generator
from datacentric.data.diffusion_draws import held_out_generator, render_generator
from datacentric.data.prompts import Prompt, read_prompts
from datacentric.settings.sections import ValidationConfig

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

LINES = [
    {"prompt": "a cat walks", "height": 32, "width": 48, "negative_prompt": "blurry"},
    {"prompt": "red car", "num_frames": 1, "seed": 42},
    "plain line",
]


def _prompts(path) -> str:
    rows = [json.dumps(x) if isinstance(x, dict) else x for x in LINES]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_prompts_line_sets_its_own_render(tmp_path):
    prompts = read_prompts(_prompts(tmp_path / "p.jsonl"))
    assert prompts == [
        Prompt(0, "a cat walks", height=32, width=48, negative_prompt="blurry"),
        Prompt(1, "red car", num_frames=1, seed=42),
        Prompt(2, "plain line"),
    ]
    for bad, says in (
        ({"prompt": "x", "height": 0}, "height must be an integer >= 1"),
        ({"prompt": "x", "seed": -1}, "seed must be an integer >= 0"),
        ({"prompt": "x", "num_frames": 2.5}, "num_frames must be an integer >= 1"),
        ({"prompt": "x", "negative_prompt": 3}, "negative_prompt must be a string"),
        ({"prompt": "x", "fps": 3}, "unknown key(s) fps"),
    ):
        (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
        with pytest.raises(DataError, match=re.escape(f"bad.jsonl line 1: {says}")):
            read_prompts(tmp_path / "bad.jsonl")
    # the documented generators: a prompt's own seed, else the run's seed and its index;
    # a held-out sample's, epoch 0 of its id
    assert torch.equal(
        torch.rand(3, generator=render_generator(7, 1, 42)),
        torch.rand(3, generator=torch.Generator().manual_seed(42)),
    )
    assert torch.equal(
        torch.rand(3, generator=render_generator(7, 0)),
        torch.rand(3, generator=sample_generator(7, 0)),
    )
    assert torch.equal(
        torch.rand(3, generator=held_out_generator(7, 5)),
        torch.rand(3, generator=sample_generator(7, 5, 0)),
    )


def test_each_prompt_renders_at_its_size_as_plain_diffusers_does(tmp_path):
    """Two sizes and a negative prompt: the run's render of each prompt equals
    ``WanPipeline`` called with the prompt's settings and :func:`render_generator`."""
    from diffusers import WanPipeline

    from datacentric.models.diffusers_render import render
    from datacentric.train.validation.renders import PipelineSamples

    folder = save_wan_pipeline(tmp_path / "wan")
    section = ValidationConfig(
        pipeline=str(folder),
        prompts=_prompts(tmp_path / "p.jsonl"),
        height=16,
        width=16,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=2.0,
    )
    samples = PipelineSamples.of(section, 7, tmp_path / "run")
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    samples.check(pipe)  # a model holding the transformer renders at every prompt's size

    def seeded(prompt: Prompt) -> torch.Generator:  # as docs/configuration.md states it
        if prompt.seed is not None:
            return torch.Generator().manual_seed(prompt.seed)
        return sample_generator(7, prompt.index)

    shapes = []
    for prompt in samples.prompts[:2]:
        settings = samples.settings_of(prompt)
        ours = render(
            pipe,
            prompt.text,
            settings,
            render_generator(7, prompt.index, prompt.seed),
            negative_prompt=prompt.negative_prompt,
        )
        plain = pipe(
            prompt=prompt.text,
            negative_prompt=prompt.negative_prompt,
            height=prompt.height or 16,
            width=prompt.width or 16,
            num_frames=prompt.num_frames or 5,
            num_inference_steps=2,
            guidance_scale=2.0,
            generator=seeded(prompt),
            output_type="np",
        ).frames[0]
        want = (np.clip(plain, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        np.testing.assert_array_equal(ours, want)
        shapes.append(ours.shape)
    assert shapes == [(5, 32, 48, 3), (1, 16, 16, 3)]
    # the negative prompt is used: without it the first render differs
    first = samples.prompts[0]
    settings = samples.settings_of(first)
    without = render(pipe, first.text, settings, render_generator(7, 0))
    with_it = render(pipe, first.text, settings, render_generator(7, 0), negative_prompt="blurry")
    assert not np.array_equal(with_it, without)


def test_a_prompt_size_the_pipeline_would_change_is_refused_before_ranks(tmp_path, capsys):
    from cli_here import cli_here
    from runtime.models.test_model_source import _latent_folder

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width

    folder = save_wan_pipeline(tmp_path / "wan")
    wan = TINY_DIFFUSERS["wan"][1]
    _latent_folder(tmp_path / "latents", wan["in_channels"], text_width(wan), count=4)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a cat", "height": 40}\n')
    capsys.readouterr()  # what saving the pipeline printed
    argv = ["train", "--model", f"diffusers:{folder}/transformer"]
    argv += ["--dataset", f"latents:{tmp_path / 'latents'}", "--validation.pipeline", str(folder)]
    argv += ["--validation.prompts", str(prompts), "--out", str(tmp_path / "run")]
    status, _, err = cli_here([*argv, "--iterations", "1", "--no-progress"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("datacentric train: prompt 0: validation.height: 40 is not"), err
    assert not (tmp_path / "run").exists()


def test_the_exported_lora_and_the_generator_reproduce_the_runs_renders(tmp_path, capsys):
    """A LoRA run renders two prompts (two sizes, a negative prompt, an own seed) at its
    last step; ``WanPipeline`` with the exported LoRA, each prompt's settings and
    :func:`render_generator` writes the same files."""
    from cli_here import cli_json_here
    from diffusers import WanPipeline
    from runtime.models.test_model_source import _latent_folder

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width
    from datacentric.models.diffusers_render import RenderSettings, render
    from datacentric.train.validation.renders import write_pixels

    folder = save_wan_pipeline(tmp_path / "wan")
    wan = TINY_DIFFUSERS["wan"][1]
    _latent_folder(tmp_path / "latents", wan["in_channels"], text_width(wan), count=4)
    prompts = _prompts(tmp_path / "p.jsonl")
    run, out = tmp_path / "run", tmp_path / "lora"
    argv = ["train", "--model", f"diffusers:{folder}/transformer", "--lora.rank", "4"]
    argv += ["--dataset", f"latents:{tmp_path / 'latents'}", "--validation.pipeline", str(folder)]
    argv += ["--validation.prompts", prompts, "--validation.height", "16"]
    argv += ["--validation.width", "16", "--validation.num_frames", "5", "--seed", "7"]
    argv += ["--validation.num_inference_steps", "2", "--validation.guidance_scale", "2.0"]
    argv += ["--iterations", "2", "--training.lr", "1e-2", "--cost-model", "analytic"]
    argv += ["--no-progress", "--no-plots", "--no-tensorboard", "--out", str(run), "--json"]
    capsys.readouterr()
    cli_json_here(argv, capsys)
    cli_json_here(["export", str(run), "--out", str(out), "--json"], capsys)
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    pipe.load_lora_weights(str(out))
    for k, prompt in enumerate(read_prompts(prompts)):
        settings = RenderSettings(
            height=prompt.height or 16,
            width=prompt.width or 16,
            num_frames=prompt.num_frames or 5,
            num_inference_steps=2,
            guidance_scale=2.0,
        )
        generator = render_generator(7, k, prompt.seed)
        negative = prompt.negative_prompt
        pixels = render(pipe, prompt.text, settings, generator, negative_prompt=negative)
        mine = write_pixels(tmp_path / f"{k}.mp4", pixels, 16)
        theirs = run / "validation" / "step-2" / f"{k}.mp4"
        assert mine.read_bytes() == theirs.read_bytes(), k
    # the trained adapters matter: the base transformer renders another first clip
    pipe.unload_lora_weights()
    first = read_prompts(prompts)[0]
    settings = RenderSettings(height=32, width=48, num_frames=5, num_inference_steps=2)
    base = render(pipe, first.text, replace(settings, guidance_scale=2.0), render_generator(7, 0))
    assert base.shape == (5, 32, 48, 3)
    untrained = write_pixels(tmp_path / "base.mp4", base, 16).read_bytes()
    assert untrained != (run / "validation" / "step-2" / "0.mp4").read_bytes()


FLUX_LINES = [
    {"prompt": "a cat walks", "height": 32, "width": 48, "negative_prompt": "blurry"},
    {"prompt": "red car", "height": 16, "width": 16, "seed": 42},
]


def test_flux_with_the_exported_lora_and_the_generator_writes_the_runs_pngs(tmp_path, capsys):
    """A Flux LoRA run renders two prompts at two sizes, one with a negative prompt (true
    classifier-free guidance, ``true_cfg_scale``); ``FluxPipeline`` loaded from the user's
    folder with the exported LoRA, each prompt's settings and :func:`render_generator`
    writes the run's PNGs byte for byte."""
    from cli_here import cli_json_here
    from diffusers import FluxPipeline
    from prepare_media import save_flux_pipeline
    from runtime.models.test_model_source import _latent_folder

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width

    folder = save_flux_pipeline(tmp_path / "flux")
    flux = TINY_DIFFUSERS["flux"][1]
    channels = flux["in_channels"] // 4  # Flux's tokens pack 2 x 2 latent pixels
    _latent_folder(tmp_path / "latents", channels, text_width(flux), count=4, max_frames=1)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in FLUX_LINES))
    run, out = tmp_path / "run", tmp_path / "lora"
    argv = ["train", "--model", f"diffusers:{folder}/transformer", "--lora.rank", "4"]
    argv += ["--dataset", f"latents:{tmp_path / 'latents'}", "--validation.pipeline", str(folder)]
    argv += ["--validation.prompts", str(prompts), "--validation.num_inference_steps", "2"]
    argv += ["--validation.guidance_scale", "3.5", "--validation.true_cfg_scale", "2.0"]
    argv += ["--seed", "7", "--iterations", "2", "--training.lr", "1e-2"]
    argv += ["--cost-model", "analytic", "--no-progress", "--no-plots", "--no-tensorboard"]
    capsys.readouterr()
    cli_json_here([*argv, "--out", str(run), "--json"], capsys)
    cli_json_here(["export", str(run), "--out", str(out), "--json"], capsys)
    pipe = FluxPipeline.from_pretrained(folder, local_files_only=True)
    pipe.load_lora_weights(str(out))
    pipe.set_progress_bar_config(disable=True)
    theirs = run / "validation" / "step-2"
    for k, line in enumerate(FLUX_LINES):
        seed = line.get("seed")
        image = pipe(
            prompt=line["prompt"],
            negative_prompt=line.get("negative_prompt"),
            height=line["height"],
            width=line["width"],
            num_inference_steps=2,
            guidance_scale=3.5,
            true_cfg_scale=2.0,
            generator=torch.Generator().manual_seed(seed) if seed else sample_generator(7, k),
        ).images[0]
        image.save(tmp_path / f"{k}.png")
        assert image.size == (line["width"], line["height"])
        assert (tmp_path / f"{k}.png").read_bytes() == (theirs / f"{k}.png").read_bytes(), k
    # the trained adapters and the negative prompt matter: each changes the first image
    first = FLUX_LINES[0]
    kwargs = {"height": 32, "width": 48, "num_inference_steps": 2, "guidance_scale": 3.5}
    kwargs["true_cfg_scale"] = 2.0
    positive = pipe(prompt=first["prompt"], generator=sample_generator(7, 0), **kwargs).images[0]
    from PIL import Image

    with_negative = np.asarray(Image.open(theirs / "0.png"))
    assert not np.array_equal(np.asarray(positive), with_negative)
    pipe.unload_lora_weights()
    base = pipe(
        prompt=first["prompt"], negative_prompt="blurry", generator=sample_generator(7, 0), **kwargs
    ).images[0]
    base.save(tmp_path / "base.png")
    assert (tmp_path / "base.png").read_bytes() != (theirs / "0.png").read_bytes()


def test_a_negative_prompt_the_pipeline_would_ignore_is_refused(tmp_path, capsys):
    """Flux uses a negative prompt only with ``true_cfg_scale`` above 1, Wan only with
    ``guidance_scale`` above 1 (diffusers' rules): otherwise the line is refused before
    ranks start, naming the prompt, not rendered as if it had none; Wan has no
    ``true_cfg_scale`` to set."""
    from cli_here import cli_here
    from prepare_media import save_flux_pipeline
    from runtime.models.test_model_source import _latent_folder

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width
    from datacentric.models.diffusers_encode import PipelineError
    from datacentric.models.diffusers_render import (
        RenderSettings,
        check_negative_prompt,
        check_render_pipeline,
    )

    flux, wan = save_flux_pipeline(tmp_path / "flux"), save_wan_pipeline(tmp_path / "wan")
    for scale in (None, 1.0):
        with pytest.raises(PipelineError, match="set validation.true_cfg_scale above 1"):
            check_negative_prompt(flux, RenderSettings(true_cfg_scale=scale))
    check_negative_prompt(flux, RenderSettings(true_cfg_scale=2.0))
    check_negative_prompt(wan, RenderSettings())  # WanPipeline's guidance_scale: 5.0
    with pytest.raises(PipelineError, match="set validation.guidance_scale above 1"):
        check_negative_prompt(wan, RenderSettings(guidance_scale=1.0))
    with pytest.raises(PipelineError, match="WanPipeline has no true_cfg_scale"):
        check_render_pipeline(wan, "WanTransformer3DModel", RenderSettings(true_cfg_scale=2.0))
    config = TINY_DIFFUSERS["flux"][1]
    latents = tmp_path / "latents"
    _latent_folder(latents, config["in_channels"] // 4, text_width(config), count=2, max_frames=1)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in FLUX_LINES))
    capsys.readouterr()  # what saving the pipelines printed
    argv = ["train", "--model", f"diffusers:{flux}/transformer", "--dataset", f"latents:{latents}"]
    argv += ["--validation.pipeline", str(flux), "--validation.prompts", str(prompts)]
    status, _, err = cli_here([*argv, "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("datacentric train: prompt 0: negative_prompt: FluxPipeline")
    assert not (tmp_path / "run").exists()
