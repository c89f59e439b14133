"""Validation renders of diffusers runs: ``--validation.pipeline`` (tiny pipelines saved
from configs, random weights, tokenizers trained here) renders each prompt with the
transformer being trained: one decodable video (Wan) or PNG (Flux) per prompt per
validation step, at the requested frames and size, the same decoded pixels on a rerun,
a contact sheet per step, an image summary per prompt per step in the event file; a
pipeline of another family, or a folder without a readable ``model_index.json``, is one
line and exit status 2 before ranks start."""

from __future__ import annotations

import numpy as np
import pytest
from cli_here import cli_here
from prepare_media import decoded_frames, save_flux_pipeline, save_wan_pipeline

pytest.importorskip("diffusers")
pytest.importorskip("av")
pytest.importorskip("tensorboard")

from runtime.models.test_model_source import _latent_folder  # noqa: E402

from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width  # noqa: E402

PROMPTS = ["a cat walks on the grass", "red car drives past green trees"]
#: every prompt's image summary at the iterations of validation steps 2 and 4
SUMMARIES = {"validation/prompt-0": [1, 3], "validation/prompt-1": [1, 3]}
#: tiny renders: 32 x 32 pixels, Wan's 5 frames (1 + 4 k), two denoising steps
RENDER = ["--validation.height", "32", "--validation.width", "32"]
RENDER += ["--validation.num_inference_steps", "2", "--validation.guidance_scale", "1.0"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny Wan and Flux pipelines, latents their transformers read, a prompts file."""
    root = tmp_path_factory.mktemp("pipelines")
    save_wan_pipeline(root / "wan")
    save_flux_pipeline(root / "flux")
    wan = TINY_DIFFUSERS["wan"][1]
    _latent_folder(root / "wan-latents", wan["in_channels"], text_width(wan), count=6)
    flux = TINY_DIFFUSERS["flux"][1]
    channels = flux["in_channels"] // 4  # Flux's tokens pack 2 x 2 latent pixels
    _latent_folder(root / "flux-latents", channels, text_width(flux), count=4, max_frames=1)
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    return root


def _argv(folders, family: str, out, *extra: str) -> list[str]:
    args = ["train", "--model", f"diffusers:{folders / family}/transformer"]
    args += ["--dataset", f"latents:{folders / (family + '-latents')}"]
    args += ["--validation.pipeline", str(folders / family)]
    args += ["--validation.prompts", str(folders / "prompts.txt"), "--validation.every", "2"]
    args += ["--iterations", "4", "--cost-model", "analytic", "--no-progress", "--no-plots"]
    return [*args, "--out", str(out), *RENDER, *extra]


def _train(folders, family: str, out, capsys, *extra: str) -> tuple[int, str]:
    """The run in this process (its ranks are spawned from it): (exit status, stderr)."""
    status, _, err = cli_here(_argv(folders, family, out, *extra), capsys)
    return status, err


def _image_summaries(out) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"), size_guidance={"images": 0})
    events.Reload()
    return {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}


@pytest.mark.slow
def test_a_wan_run_renders_a_video_per_prompt_at_each_validation(folders, tmp_path, capsys):
    pixels = {}
    for run in ("first", "rerun"):
        out = tmp_path / run
        status, err = _train(
            folders, "wan", out, capsys, "--world", "2", "--validation.num_frames", "5"
        )
        assert status == 0, err[-3000:]
        for step in (2, 4):
            folder = out / "validation" / f"step-{step}"
            names = sorted(p.name for p in folder.iterdir())
            assert names == ["0.mp4", "1.mp4", "contact_sheet.png"]
            for prompt in range(len(PROMPTS)):
                frames = decoded_frames(folder / f"{prompt}.mp4")
                assert len(frames) == 5 and frames[0].size == (32, 32)
                pixels[run, step, prompt] = np.stack([np.asarray(f) for f in frames])
        # rank 1 rendered prompt 1: both ranks' renders are in the log and the event file
        assert _image_summaries(out) == SUMMARIES
    for key, value in pixels.items():
        if key[0] == "first":
            np.testing.assert_array_equal(value, pixels["rerun", *key[1:]])
    assert not np.array_equal(pixels["first", 2, 0], pixels["first", 2, 1])  # seeds per prompt


@pytest.mark.slow
def test_a_flux_run_renders_a_png_per_prompt(folders, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "flux"
    status, err = _train(folders, "flux", out, capsys)
    assert status == 0, err[-3000:]
    for step in (2, 4):
        folder = out / "validation" / f"step-{step}"
        assert sorted(p.name for p in folder.iterdir()) == ["0.png", "1.png", "contact_sheet.png"]
        assert Image.open(folder / "0.png").size == (32, 32)
        assert Image.open(folder / "contact_sheet.png").size == (32, 64)  # a row per prompt
    assert _image_summaries(out) == SUMMARIES


@pytest.mark.slow
def test_a_pipeline_that_cannot_render_for_the_run_is_one_line_before_ranks_start(
    folders, tmp_path, capsys
):
    """The command in this process (the check runs before any rank starts)."""

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    cases = [
        (["--validation.pipeline", str(folders / "flux")], "FluxPipeline for a FluxTransformer2D"),
        (["--validation.pipeline", str(tmp_path / "empty")], "no model_index.json"),
        (["--validation.pipeline", str(broken)], "is not JSON"),
        (["--validation.num_frames", "6"], "validation.num_frames: 6 is not 1 + a multiple of 4"),
    ]
    for extra, message in cases:
        status, err = _train(folders, "wan", tmp_path / "run", capsys, *extra)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, err[-2000:]
        assert lines[0].startswith("datacentric train: validation.") and message in lines[0]
        assert not (tmp_path / "run").exists()
