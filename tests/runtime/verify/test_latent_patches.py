"""A latent that is not whole patches of the model's own is refused before ranks start,
naming the sample, its file and the model's patch setting (it failed inside the ranks:
"latents of (3, 4, 6) ... are not whole patches of (2, 2, 2)"); latents that are train."""

from __future__ import annotations

import pytest
import torch
from cli_here import cli_here

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["--world", "1", "--cost-model", "analytic", "--iterations", "1", "--no-progress"]
RUN += ["--no-plots", "--no-tensorboard"]


def _latents(folder, shapes) -> str:  # noqa: ANN001
    """Latents of ``shapes`` (frames, height, width; 4 channels), each with 6 text rows."""
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for i, (frames, height, width) in enumerate(shapes):
        latent = torch.randn(frames, 4, height, width, generator=generator)
        save_file({"latent": latent}, str(folder / f"c{i}.safetensors"))
        save_file(
            {"latent": torch.randn(6, 32, generator=generator)},
            str(folder / f"c{i}.text.safetensors"),
        )
    return f"latents:{folder}"


def _train(tmp_path, capsys, shapes, *model_args: str) -> tuple[int, str]:  # noqa: ANN001
    model = ["--model", "diffusers:hunyuan-video"]
    for arg in model_args:
        model += ["--model-arg", arg]
    data = _latents(tmp_path / "latents", shapes)
    out = tmp_path / "run"
    status, _, err = cli_here(["train", *model, "--dataset", data, *RUN, "--out", str(out)], capsys)
    return status, err


def test_odd_frames_for_a_frame_patch_of_2_are_refused_naming_sample_and_setting(tmp_path, capsys):
    shapes = [(2, 4, 4), (3, 4, 6), (2, 6, 4), (1, 4, 4)]
    status, err = _train(tmp_path, capsys, shapes, "patch_size_t=2")
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    latent = tmp_path / "latents" / "c1.safetensors"
    assert line.startswith(
        f"datacentric train: model 'diffusers:hunyuan-video': sample 1 ({latent})"
    )
    assert "(and 1 other sample(s))" in line and "a latent of 3 x 4 x 6" in line
    assert "the model's 2 x 2 x 2 (patch_size_t)" in line and "its frames must be" in line
    assert "Traceback" not in err and not (tmp_path / "run" / "config.json").exists()


def test_a_width_off_a_patch_of_4_is_refused_naming_patch_size(tmp_path, capsys):
    status, err = _train(tmp_path, capsys, [(1, 4, 4), (1, 4, 6)], "patch_size=4")
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert "sample 1 (" in line and "a latent of 1 x 4 x 6" in line
    assert "1 x 4 x 4 (patch_size): its width must be" in line
    assert not (tmp_path / "run" / "config.json").exists()


def test_latents_of_whole_patches_train(tmp_path, capsys):
    status, err = _train(tmp_path, capsys, [(2, 4, 4), (2, 4, 6), (4, 6, 4)], "patch_size_t=2")
    assert status == 0, err[-2000:]
