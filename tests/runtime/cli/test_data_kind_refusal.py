"""A model given data of the other kind (a text model given video, a video model given
text, a diffusers model given data without text embeddings) is refused in one line
naming both settings and the fix, before the ranks start; the kinds that go together
still pass that check."""

from __future__ import annotations

import json

import pytest
import torch
from cli_here import cli_here

from datacentric.data import open_dataset
from datacentric.data.video import SyntheticVideoDataset
from datacentric.models.source import DataKindError, check_data_kind, resolve_model
from datacentric.shapes import SampleShape

LATENTS = "video latents with their text embeddings"
TEXT_FIX = "give text (--dataset stdlib, jsonl:FILE, parquet:FILE or text:FILE)"
LATENTS_FIX = "give --dataset latents:DIR with text embeddings (datacentric prepare writes one)"
VIDEO_FIX = "give video (--dataset latents:DIR, or a video workload preset: opensora-short, ...)"


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": "word " * (9 + i)}) + "\n" for i in range(6)))
    return f"jsonl:{path}"


def latents_folder(folder, with_text: bool) -> str:
    """``latents:DIR`` of three small latents, each with its text embedding or none."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    folder.mkdir()
    for i in range(3):
        save_file({"latent": torch.randn(2, 4, 4, 4, generator=generator)}, str(folder / f"{i}.st"))
        if with_text:
            text = torch.randn(6, 32, generator=generator)
            save_file({"latent": text}, str(folder / f"{i}.text.safetensors"))
    for path in folder.glob("*.st"):
        path.rename(path.with_suffix(".safetensors"))
    return f"latents:{folder}"


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--model", "diffusers:wan"],
            f"--model diffusers:wan trains on {LATENTS}, and --dataset stdlib holds text: "
            + LATENTS_FIX,
        ),
        (
            ["--model", "diffusers:wan", "--dataset", "opensora-short", "--world", "2"],
            f"--model diffusers:wan trains on {LATENTS}, and --dataset opensora-short holds "
            "video latents without text embeddings: " + LATENTS_FIX,
        ),
        (
            ["--model", "llama", "--dataset", "opensora-short"],
            "--model llama trains on text, and --dataset opensora-short holds video latents: "
            + TEXT_FIX,
        ),
        (
            ["--model", "hf:qwen2", "--dataset", "opensora-balanced", "--world", "2"],
            "--model hf:qwen2 trains on text, and --dataset opensora-balanced holds video "
            "latents: " + TEXT_FIX,
        ),
        (
            ["--model", "dit", "--dataset", "stdlib"],
            "--model dit trains on video latents, and --dataset stdlib holds text: " + VIDEO_FIX,
        ),
    ],
)
def test_a_model_given_data_of_the_other_kind_is_refused_before_the_ranks(
    flags, line, capsys, monkeypatch, tmp_path
):
    pytest.importorskip("diffusers" if "diffusers:wan" in flags else "torch")
    pytest.importorskip("transformers" if "hf:qwen2" in flags else "torch")
    import datacentric.parallel.launch as launching

    def no_ranks(*_, **__):
        raise AssertionError("the ranks started")

    monkeypatch.setattr(launching, "launch", no_ranks)
    argv = ["train", *flags, "--iterations", "1", "--out", str(tmp_path / "run")]
    status, _, err = cli_here(argv, capsys)
    assert status == 2
    assert err.splitlines()[-1] == f"datacentric train: {line}", err


def test_a_diffusers_model_given_text_files_is_refused(docs, capsys, tmp_path):
    pytest.importorskip("diffusers")
    argv = ["train", "--model", "diffusers:wan", "--dataset", docs, "--out", str(tmp_path)]
    status, _, err = cli_here(argv, capsys)
    assert status == 2
    assert err.splitlines()[-1] == (
        f"datacentric train: --model diffusers:wan trains on {LATENTS}, and --dataset "
        f"{docs} holds text: {LATENTS_FIX}"
    ), err


def test_the_model_check_refuses_it_naming_the_model_and_the_dataset():
    """``check_model`` (the model's check before the ranks, for every command that runs
    one) refuses it before its build's own error (here: 'LlamaConfig has no field(s)
    ['in_channels']', the preset following the latents)."""
    from datacentric.settings.sections import ModelConfig
    from datacentric.train.build import check_model

    with pytest.raises(DataKindError) as refused:
        check_model(ModelConfig(model="llama"), open_dataset("opensora-short"))
    assert str(refused.value) == (
        f"model 'llama' trains on text, and the dataset holds video latents: {TEXT_FIX}"
    )


def test_a_model_built_for_later_data_is_not_refused():
    """The public build takes any dataset (a diffusers model built beside text, then
    trained on the latents ``small_dataset`` gives it, as the examples do)."""
    from datacentric.models import build_model_named

    build_model_named("diffusers:wan", dataset=open_dataset("stdlib"), device="meta")


def _synthetic_video(context: bool) -> SyntheticVideoDataset:
    shapes = [SampleShape(4, (1, 2, 2)), SampleShape(8, (2, 2, 2))]
    return SyntheticVideoDataset(shapes, channels=4, context_shape=(5, 32) if context else None)


@pytest.mark.parametrize(
    ("model", "data"),
    [
        ("llama", "stdlib"),
        ("hf:qwen2", "docs"),
        ("dit", "opensora-short"),
        ("dit", "latents"),
        ("dit", "latents without text"),
        ("diffusers:wan", "latents"),
        ("diffusers:wan", "synthetic video with text"),
        ("tests.user_models:tiny_gpt", "opensora-short"),  # a factory: cannot tell
    ],
)
def test_the_kinds_that_go_together_pass(model, data, docs, tmp_path):
    opened = {
        "docs": lambda: open_dataset(docs),
        "latents": lambda: open_dataset(latents_folder(tmp_path / "l", True)),
        "latents without text": lambda: open_dataset(latents_folder(tmp_path / "l", False)),
        "synthetic video with text": lambda: _synthetic_video(True),
    }.get(data, lambda: open_dataset(data))()
    check_data_kind(resolve_model(model), opened)


def test_a_diffusers_model_given_synthetic_video_without_text_is_refused():
    with pytest.raises(DataKindError, match="holds video latents without text embeddings"):
        check_data_kind(resolve_model("diffusers:wan"), _synthetic_video(False))


def test_a_diffusers_model_trains_on_latents_with_text(tmp_path, capsys):
    """The whole check before the ranks passes for it (nothing refused, nothing trained)."""
    pytest.importorskip("diffusers")
    from datacentric.cli.precheck import check_dataset
    from datacentric.settings import load_config

    data = latents_folder(tmp_path / "latents", True)
    settings = dict(model="diffusers:wan", dataset=data, cost_model="analytic", iterations=1)
    config = load_config(None, out=str(tmp_path / "run"), **settings)
    assert check_dataset(config, "train") is not None, capsys.readouterr().err
