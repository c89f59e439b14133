"""A config that gives a width per layer (a list) is priced, at its widest layer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from datacentric.planning.spec_derivation import spec_from_hf_config


def _config(**values):  # noqa: ANN202
    base = dict(
        model_type="gemma3n_text",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        intermediate_size=128,
        vocab_size=256,
    )
    return SimpleNamespace(**{**base, **values})


def test_a_per_layer_width_list_is_priced_at_its_widest_layer() -> None:
    uniform = spec_from_hf_config(_config(intermediate_size=128))
    listed = spec_from_hf_config(_config(intermediate_size=[96, 128, 64]))
    assert listed.ffn_hidden == 128 and listed.num_blocks == uniform.num_blocks == 3
    assert listed == uniform


def test_an_empty_width_list_is_named() -> None:
    with pytest.raises(ValueError, match="empty per-layer width list"):
        spec_from_hf_config(_config(intermediate_size=[]))
