"""Analytic specs read from Hugging Face configs count the parameters of the real model."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from datacentric.models.hf import build_hf_model  # noqa: E402
from datacentric.models.hf_tiny import TINY_CONFIGS  # noqa: E402
from datacentric.planning.spec_derivation import spec_from_hf_config  # noqa: E402
from datacentric.profiling.factory import get_model_spec  # noqa: E402


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_parameter_count_matches_the_built_model(name: str) -> None:
    model = build_hf_model(name)
    spec = spec_from_hf_config(model.config)
    actual = sum(p.numel() for p in model.parameters())
    # Norm weights and biases are not counted (see model_specs); tiny widths make them
    # weigh more than at real sizes.
    assert spec.num_params == pytest.approx(actual, rel=0.05)
    assert spec.num_blocks == len(model.blocks)
    assert (spec.kv_heads or spec.heads) == model.num_kv_heads


def test_gpt2_is_ungated_with_learned_positions() -> None:
    spec = spec_from_hf_config(build_hf_model("gpt2").config)
    assert not spec.gated_mlp and spec.extra_outer_params == 8192 * 64


def test_a_config_without_widths_is_named() -> None:
    class Empty:
        model_type = "mystery"

    with pytest.raises(ValueError, match="hidden_size"):
        spec_from_hf_config(Empty())


def test_wan_spec_counts_the_block_parameters() -> None:
    pytest.importorskip("diffusers")
    from datacentric.models.diffusers_video import build_wan
    from datacentric.planning.spec_derivation import spec_from_config

    model = build_wan()
    spec = spec_from_config(model.config)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    # biases and norm weights are not counted; at width 64 they weigh a few percent
    assert spec.block_params == pytest.approx(block, rel=0.1)
    assert spec.num_blocks == len(model.blocks) and spec.heads == model.num_heads


def test_runnable_specs_count_the_real_parameters() -> None:
    from datacentric.models.presets import model_facts

    for name in ("llama", "dit"):
        assert get_model_spec(name).num_params == model_facts(name).num_params


@pytest.mark.parametrize("name", ["llama", "hf:qwen2"])
def test_a_named_lora_spec_is_the_models_with_only_the_adapters_trained(name: str) -> None:
    pytest.importorskip("peft")
    from dataclasses import replace

    from datacentric.models.lora import lora_spec
    from datacentric.models.source import build_from_source, resolve_model
    from datacentric.planning.spec_derivation import spec_of_model
    from datacentric.profiling.factory import named_spec

    lora = lora_spec(4)
    adapted, _ = build_from_source(replace(resolve_model(name, {}), lora=lora), device="meta")
    adapters = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    spec = named_spec(name, lora=lora)
    assert 0 < spec.trainable_params == adapters < spec.num_params
    # the same architecture as without adapters, and as read from the adapted module
    assert replace(spec, trainable_params=None) == named_spec(name)
    assert spec.trainable_params == spec_of_model(adapted, name).trainable_params


def test_a_named_spec_with_adapters_builds_the_model_once(monkeypatch) -> None:
    """The spec of a named model with LoRA adapters is read off one meta build: the
    spec before the adapters go in, what trains after (two builds before)."""
    pytest.importorskip("peft")
    from datacentric.models import source
    from datacentric.models.lora import lora_spec
    from datacentric.profiling import factory

    builds = []
    real = source.build_from_source

    def counted(*args, **kwargs):
        builds.append(kwargs.get("device"))
        return real(*args, **kwargs)

    monkeypatch.setattr(source, "build_from_source", counted)
    # arguments no other test names: nothing cached answers
    spec = factory.named_spec("hf:qwen2", {"num_hidden_layers": 3}, lora=lora_spec(3))
    assert builds == ["meta"]
    assert 0 < spec.trainable_params < spec.num_params and spec.num_blocks == 3
