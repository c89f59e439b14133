"""``train`` regresses rectified flow's velocity (``noise - x0``): a diffusers model whose
pipeline samples by another objective (CogVideoX's v-prediction DDIM) is refused in one
line before ranks start, whether the pipeline folder or its ``transformer/`` is given;
flow-matching schedulers (Flux's, Wan's UniPC with ``flow_prediction``) pass."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_here

from datacentric.models.model_args import ModelSourceError, check_pipeline_scheduler

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")

COGVIDEOX_SCHEDULER = {
    "_class_name": "CogVideoXDDIMScheduler",
    "prediction_type": "v_prediction",
    "rescale_betas_zero_snr": True,
    "timestep_spacing": "trailing",
}


def _pipeline(folder, scheduler: dict) -> None:
    """A pipeline folder as ``save_pretrained`` lays it out: ``model_index.json``, the
    tiny CogVideoX transformer, and ``scheduler``'s config."""
    import diffusers

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    class_name, config = TINY_DIFFUSERS["cogvideox"]
    torch.manual_seed(0)
    getattr(diffusers, class_name).from_config(config).save_pretrained(folder / "transformer")
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler))
    index = {
        "_class_name": "CogVideoXPipeline",
        "transformer": ["diffusers", class_name],
        "scheduler": ["diffusers", scheduler["_class_name"]],
    }
    (folder / "model_index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("given", ["cog", "cog/transformer"])
def test_a_v_prediction_pipeline_is_refused_before_training(tmp_path, capsys, given):
    from runtime.models.test_model_source import _latent_folder

    _pipeline(tmp_path / "cog", COGVIDEOX_SCHEDULER)
    _latent_folder(tmp_path / "latents", 4, 32, count=4)
    argv = ["train", "--model", f"diffusers:{tmp_path / given}", "--lora.rank", "4"]
    argv += ["--dataset", f"latents:{tmp_path / 'latents'}", "--iterations", "1"]
    argv += ["--cost-model", "analytic", "--no-progress", "--out", str(tmp_path / "run")]
    status, _, err = cli_here(argv, capsys)
    lines = err.strip().splitlines()
    assert status == 2, err[-2000:]
    model = f"diffusers:{tmp_path / given}"
    assert lines[-1].startswith(f"datacentric train: model '{model}': its pipeline"), err
    assert "CogVideoXDDIMScheduler (prediction_type 'v_prediction'" in lines[-1]
    assert "rectified flow" in lines[-1] and "FlowMatchEulerDiscreteScheduler" in lines[-1]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "scheduler",
    [
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0},
        {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction"},
    ],
)
def test_a_flow_matching_pipeline_passes(tmp_path, scheduler):
    _pipeline(tmp_path / "p", scheduler)
    check_pipeline_scheduler("diffusers:p", tmp_path / "p")
    check_pipeline_scheduler("diffusers:p/transformer", tmp_path / "p" / "transformer")


def test_a_transformer_folder_outside_a_pipeline_passes(tmp_path):
    _pipeline(tmp_path / "p", COGVIDEOX_SCHEDULER)
    (tmp_path / "p" / "model_index.json").unlink()
    check_pipeline_scheduler("diffusers:t", tmp_path / "p" / "transformer")
    with pytest.raises(ModelSourceError):
        (tmp_path / "p" / "model_index.json").write_text("{}")
        check_pipeline_scheduler("diffusers:t", tmp_path / "p" / "transformer")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_scheduler_config_that_does_not_read_is_refused_naming_it(tmp_path, text):
    """Its objective cannot be known, so the run is not started as if it were flow."""
    _pipeline(tmp_path / "p", COGVIDEOX_SCHEDULER)
    config = tmp_path / "p" / "scheduler" / "scheduler_config.json"
    config.write_text(text)
    with pytest.raises(ModelSourceError, match="scheduler_config.json"):
        check_pipeline_scheduler("diffusers:p", tmp_path / "p")
