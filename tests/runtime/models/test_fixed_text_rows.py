"""CogVideoX with fixed (non-rotary) positions adds its position table to exactly
``max_text_seq_length`` text rows: shorter text files are refused before ranks start,
naming the file, the tensor and its size (they failed inside the ranks with "The size
of tensor a (11) must match the size of tensor b (14)")."""

from __future__ import annotations

import pytest
import torch
from cli_here import cli_here

diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["--cost-model", "analytic", "--iterations", "1", "--no-progress"]


def _cogvideox(folder) -> str:
    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    _, config = TINY_DIFFUSERS["cogvideox"]  # max_text_seq_length 8
    torch.manual_seed(0)
    fixed = {**config, "use_rotary_positional_embeddings": False}
    diffusers.CogVideoXTransformer3DModel.from_config(fixed).save_pretrained(folder)
    return f"diffusers:{folder}"


def _latents(folder, text_rows: int) -> str:
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for i in range(4):
        latent = torch.randn(1 + i % 3, 4, 4, 4 + 2 * (i % 2), generator=generator)
        save_file({"latent": latent}, str(folder / f"c{i}.safetensors"))
        text = torch.randn(text_rows, 32, generator=generator)
        save_file({"latent": text}, str(folder / f"c{i}.text.safetensors"))
    return f"latents:{folder}"


def test_short_text_files_are_refused_naming_file_tensor_and_size(tmp_path, capsys):
    from datacentric.data.sources import open_dataset
    from datacentric.settings.sections import ModelConfig
    from datacentric.train.build import check_model

    model = _cogvideox(tmp_path / "cog")
    short = _latents(tmp_path / "short", text_rows=5)
    out = tmp_path / "run"
    capsys.readouterr()
    argv = ["train", "--model", model, "--dataset", short, *RUN, "--out", str(out)]
    status, _, err = cli_here(argv, capsys)
    assert status == 2
    (line,) = [line for line in err.splitlines() if "text embedding" in line]
    assert f"{tmp_path / 'short' / 'c0.text.safetensors'}: the text embedding is 5 x 32" in line
    assert "max_text_seq_length=8" in line and "Traceback" not in err
    assert not (out / "config.json").exists()  # no rank started
    # text files of max_text_seq_length rows pass the same check
    full = open_dataset(_latents(tmp_path / "full", text_rows=8))
    check_model(ModelConfig(model=model), full)
