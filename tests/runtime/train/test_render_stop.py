"""A stop signal during a validation render is honoured at once: the render ends before
the transformer's next forward (a tiny Wan pipeline at the pipeline's default size and 50
steps ran for many minutes past a SIGTERM, which then waited on it), the run saves its
last step and exits with ``128 + signal`` as at any stop. Before the first render rank 0
says what it renders, and which settings make it smaller when the pipeline's defaults
fill it in."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cli_here import cli_here
from prepare_media import save_wan_pipeline

pytest.importorskip("diffusers")
pytest.importorskip("av")

from runtime.models.test_model_source import _latent_folder  # noqa: E402

from datacentric.data.prompts import Prompt  # noqa: E402
from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width  # noqa: E402
from datacentric.models.diffusers_render import RenderSettings, render  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: a tiny render held long by its step count (each denoising step is one forward)
SLOW = RenderSettings(16, 16, num_frames=5, num_inference_steps=30, guidance_scale=1.0)


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """The tiny Wan pipeline, latents its transformer reads, a prompts file."""
    root = tmp_path_factory.mktemp("wan")
    save_wan_pipeline(root / "wan")
    config = TINY_DIFFUSERS["wan"][1]
    _latent_folder(root / "latents", config["in_channels"], text_width(config), count=4)
    (root / "prompts.txt").write_text("a cat walks on the grass\nred car drives past\n")
    return root


def _counted(transformer: torch.nn.Module, on_call=None) -> list[int]:
    """A list that grows by one as each forward of ``transformer`` ends (``on_call(n)``
    then)."""
    calls: list[int] = []

    def hook(module, args, output):
        calls.append(len(calls) + 1)
        if on_call is not None:
            on_call(len(calls))

    transformer.register_forward_hook(hook)
    return calls


def test_a_render_ends_before_the_transformer_s_next_forward_once_stopped(wan):
    """Stopped after 3 forwards of a guided render (2 a step): the 4th, the second half
    of step 2 of 30, never runs, and the transformer keeps no hook."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(wan / "wan")
    calls = _counted(pipe.transformer)
    guided = RenderSettings(16, 16, num_frames=5, num_inference_steps=30, guidance_scale=5.0)
    stop = lambda: len(calls) >= 3  # noqa: E731
    pixels = render(pipe, "a cat", guided, torch.Generator().manual_seed(0), stop=stop)
    assert pixels is None
    assert len(calls) == 3, calls
    assert (
        not pipe.transformer._forward_pre_hooks
        and not pipe.transformer.blocks[0]._forward_pre_hooks
    )
    calls.clear()  # a stop within a forward: its next block never runs, nor does it end
    blocks = _counted(pipe.transformer.blocks[0])
    pixels = render(pipe, "a cat", guided, torch.Generator(), stop=lambda: blocks)
    assert pixels is None and blocks == [1] and calls == []
    blocks.clear()
    done = render(pipe, "a cat", RenderSettings(16, 16, 5, 2, 1.0), torch.Generator(), stop=None)
    assert done.shape == (5, 16, 16, 3) and len(calls) == 2


def test_a_sigterm_during_a_render_saves_the_last_step_at_once(wan, tmp_path, capsys, monkeypatch):
    """SIGTERM at the first render's first denoising step (after step 2 of 4): the run
    stops there, its checkpoint holds step 2, no render file is written."""
    from datacentric.train.validation import renders

    seen: list[list[int]] = []
    real = renders.render

    def sigterm_at_first(n: int) -> None:
        if n == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def held_render(pipe, *args, **kwargs):
        if not seen:  # the first render: a SIGTERM at its first step
            seen.append(_counted(pipe.transformer, sigterm_at_first))
        return real(pipe, *args, **kwargs)

    monkeypatch.setattr(renders, "render", held_render)
    out = tmp_path / "run"
    argv = ["train", "--model", f"diffusers:{wan / 'wan'}/transformer"]
    argv += ["--dataset", f"latents:{wan / 'latents'}", "--iterations", "4"]
    argv += ["--validation.pipeline", str(wan / "wan"), "--validation.every", "2"]
    argv += ["--validation.prompts", str(wan / "prompts.txt"), "--cost-model", "analytic"]
    argv += ["--validation.height", "16", "--validation.width", "16"]
    argv += ["--validation.num_frames", "5", "--validation.num_inference_steps", "30"]
    argv += ["--validation.guidance_scale", "1.0", "--no-progress", "--no-plots"]
    status, _, err = cli_here([*argv, "--out", str(out)], capsys)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    assert seen and len(seen[0]) == 1, seen  # the forward the signal came after, no other
    assert (out / "checkpoints" / "step-00000002").is_dir(), sorted((out / "checkpoints").iterdir())
    assert not list((out / "validation" / "step-2").glob("*.mp4"))
    assert "stopped by SIGTERM after step 2" in err, err[-3000:]
    assert "validation renders 2 prompt(s) at 16 x 16, 5 frames, 30 steps on cpu\n" in err, err
    assert cli_here([*argv, "--out", str(out), "--resume"], capsys)[0] == 0
    straight = tmp_path / "straight"
    assert cli_here([*argv, "--out", str(straight)], capsys)[0] == 0
    for step in (2, 4):
        names = sorted(p.name for p in (straight / "validation" / f"step-{step}").iterdir())
        assert names == ["0.mp4", "1.mp4", "contact_sheet.png"], names
        for name in names:
            path = Path("validation") / f"step-{step}" / name
            assert (out / path).is_file(), sorted((out / "validation").rglob("*"))
            assert (out / path).read_bytes() == (straight / path).read_bytes(), path


def test_the_first_render_says_what_it_renders_and_how_to_render_smaller(wan, caplog):
    from datacentric.train.validation.renders import PipelineSamples

    def said(settings: RenderSettings, prompts: list[Prompt] | None = None) -> str:
        prompts = prompts or [Prompt(0, "a cat")]
        samples = PipelineSamples(prompts, str(wan / "wan"), settings, 16, 0, wan / "run")
        samples.images = False
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=renders_logger):
            for _ in range(2):  # said once
                samples._say(torch.nn.Module(), torch.device("cpu"))
        return caplog.text

    renders_logger = "datacentric.train.validation.renders"
    text = said(RenderSettings())
    assert text.count("validation renders") == 1, text
    assert "480 x 832, 81 frames, 50 steps on cpu" in text, text
    assert "validation.num_frames" in text and "validation.num_inference_steps" in text, text
    text = said(RenderSettings(16, 16, 5, 2))
    assert "16 x 16, 5 frames, 2 steps on cpu" in text and "smaller" not in text, text
    # each prompt at its own size and frames (a prompts file's height, width, num_frames)
    own = [Prompt(0, "a cat", height=48, width=32, num_frames=5), Prompt(1, "a car")]
    own += [Prompt(2, "a dog", height=48, width=32, num_frames=5)]
    text = said(RenderSettings(16, 16, 9, 2), own)
    sizes = "48 x 32, 5 frames, 2 steps (prompts 0, 2); 16 x 16, 9 frames, 2 steps (prompt 1)"
    assert f"validation renders 3 prompt(s) at {sizes} on cpu\n" in text, text
    own = [replace(p, height=48, width=32, num_frames=5) for p in own]
    text = said(RenderSettings(num_inference_steps=2), own)
    assert "at 48 x 32, 5 frames, 2 steps on cpu\n" in text and "smaller" not in text, text
