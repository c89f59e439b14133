"""A pretrained model trained at the default learning rate is said before the ranks start:
``training.lr``'s default is a rate for training from scratch, far above fine-tuning
rates; the default stays, and the note names the flag that sets another."""

from __future__ import annotations

import json

import pytest

from datacentric.cli.main import build_parser
from datacentric.cli.train import lr_given, pretrained_lr_note
from datacentric.settings import load_config


def _folder(tmp_path, weights: bool):
    """An ``hf:`` folder: a config.json, and a safetensors weight file with ``weights``."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("lora_rank", [0, 8])
def test_a_pretrained_model_at_the_default_lr_is_noted(lora_rank, tmp_path):
    model = f"hf:{_folder(tmp_path, weights=True)}"
    config = load_config(None, model=model, lora_rank=lora_rank)
    note = pretrained_lr_note(config, lr_given=False)
    assert note is not None
    assert note.startswith(f"training.lr {config.training.lr:g} (the default) is a rate for")
    assert "--training.lr" in note
    assert ("1e-4 for the LoRA adapters" in note) == bool(lora_rank)


def test_a_diffusers_pipeline_with_weights_is_noted(tmp_path):
    """A ``diffusers:`` pipeline folder: its ``transformer/`` holds the weights."""
    transformer = tmp_path / "pipe" / "transformer"
    transformer.mkdir(parents=True)
    (tmp_path / "pipe" / "model_index.json").write_text("{}", encoding="utf-8")
    config = {"_class_name": "WanTransformer3DModel"}
    (transformer / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (transformer / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    config = load_config(None, model=f"diffusers:{tmp_path / 'pipe'}")
    assert "2e-5, or 1e-4 with LoRA" in pretrained_lr_note(config, lr_given=False)


@pytest.mark.parametrize(
    ("model", "given"),
    [("weights", True), ("config-only", False), ("llama", False), ("hf:qwen2", False)],
)
def test_no_note_when_lr_is_given_or_the_weights_are_random(model, given, tmp_path):
    """Not said when the lr was given, nor for a folder with no weights, a preset or a
    tiny name (random weights: trained from scratch)."""
    if model in ("weights", "config-only"):
        model = f"hf:{_folder(tmp_path, weights=model == 'weights')}"
    config = load_config(None, model=model)
    assert pretrained_lr_note(config, lr_given=given) is None


@pytest.mark.parametrize(
    ("argv", "file", "given"),
    [
        ([], None, False),
        (["--training.lr", "2e-5"], None, True),
        (["--lr", "3e-3"], None, True),  # the default's value, but given
        ([], "[training]\nlr = 1e-4\n", True),
        ([], "[training]\nepochs = 2\n", False),
    ],
)
def test_lr_given_by_a_flag_or_the_config_file(argv, file, given, tmp_path):
    if file is not None:
        (tmp_path / "run.toml").write_text(file, encoding="utf-8")
        argv = [*argv, "--config", str(tmp_path / "run.toml")]
    args = build_parser().parse_args(["train", *argv])
    assert lr_given(args) is given
