"""The Python API refuses a model given data of the other kind where the two meet, in
the line the CLI's check before the ranks says (its reason): ``DataCentric(model,
dataset)`` (even with ``check_model=False``, where the mismatch reached a step) and a
preset built to follow the data (``build_model_named(name, dataset=...)``), which failed
inside the preset's config; the kinds that go together pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from datacentric import DataCentric
from datacentric.data import open_dataset
from datacentric.models import LlamaConfig, build_model_named
from datacentric.models.source import DataKindError

TEXT_FIX = "give text (--dataset stdlib, jsonl:FILE, parquet:FILE or text:FILE)"
VIDEO_FIX = "give video (--dataset latents:DIR, or a video workload preset: opensora-short, ...)"
LATENTS_FIX = "give --dataset latents:DIR with text embeddings (datacentric prepare writes one)"
SMALL = {"num_layers": 1}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        (
            "llama",
            "opensora-short",
            f"model 'llama' trains on text, and the dataset holds video latents: {TEXT_FIX}",
        ),
        (
            "dit",
            "stdlib",
            f"model 'dit' trains on video latents, and the dataset holds text: {VIDEO_FIX}",
        ),
    ],
)
def test_a_preset_built_to_follow_data_of_the_other_kind_is_refused(name, data, line):
    """The Llama said '(LlamaConfig) has no field(s) ['in_channels']' (a ``TypeError``);
    the DiT was built, for data it cannot train on."""
    with pytest.raises(DataKindError) as refused:
        build_model_named(name, SMALL, dataset=open_dataset(data))
    assert str(refused.value) == line


@pytest.mark.parametrize("check_model", [True, False])
@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        (
            "llama",
            "opensora-short",
            f"model 'Llama' trains on text, and the dataset holds video latents: {TEXT_FIX}",
        ),
        (
            "dit",
            "stdlib",
            f"model 'VideoDiT' trains on video latents, and the dataset holds text: {VIDEO_FIX}",
        ),
    ],
)
def test_data_centric_refuses_a_model_given_data_of_the_other_kind(name, data, line, check_model):
    """Before, the model contract's forward said 'Llama expects token ids of shape (S,),
    got inputs (144, 16)'; with ``check_model=False`` the first step failed."""
    model = build_model_named(name, SMALL)
    with pytest.raises(DataKindError) as refused:
        DataCentric(model, open_dataset(data), device="cpu", shard="none", check_model=check_model)
    assert str(refused.value) == line


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "hf:qwen2",
            f"model 'HFCausalLM' trains on text, and the dataset holds video latents: {TEXT_FIX}",
        ),
        (
            "diffusers:wan",
            "model 'DiffusersVideoTransformer' trains on video latents with their text "
            "embeddings, and the dataset holds video latents without text embeddings: "
            + LATENTS_FIX,
        ),
    ],
)
def test_data_centric_refuses_a_pretrained_kind_given_other_data(name, line):
    pytest.importorskip("transformers" if name.startswith("hf:") else "diffusers")
    model = build_model_named(name)
    with pytest.raises(DataKindError) as refused:
        DataCentric(model, open_dataset("opensora-short"), device="cpu", shard="none")
    assert str(refused.value) == line


def test_the_kinds_that_go_together_still_construct():
    """A text model on text, and a factory's model (its kind cannot be told: the model
    contract's own check decides)."""
    text = build_model_named("llama", SMALL)
    DataCentric(text, open_dataset("stdlib"), device="cpu", shard="none")
    factory = build_model_named("tests.user_models:tiny_gpt")
    DataCentric(factory, open_dataset("stdlib"), device="cpu", shard="none")


class LatentsOnLlamaConfig(nn.Module):
    """A user's own video model that holds the public ``LlamaConfig`` (for its blocks)."""

    loss_mode = "sample"

    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(hidden_size=64, num_layers=1, num_heads=2, ffn_hidden_size=128)
        self.blocks = nn.ModuleList([nn.Linear(64, 64)])
        self.num_heads = 2

    def set_attention(self, fn) -> None:
        pass


def test_a_user_s_own_model_holding_a_llama_config_is_not_told_a_text_model():
    """Only our presets (compiled too) are told by what they are: a user's model that
    holds a ``LlamaConfig`` was refused as 'model 'LatentsOnLlamaConfig' trains on text'."""
    latents = open_dataset("opensora-short")
    DataCentric(LatentsOnLlamaConfig(), latents, device="cpu", shard="none", check_model=False)
    compiled = torch.compile(build_model_named("llama", SMALL))
    with pytest.raises(DataKindError, match="trains on text, and the dataset holds video"):
        DataCentric(compiled, latents, device="cpu", shard="none", check_model=False)
