"""``datacentric.models.hf`` keeps every name it had before the attention implementation,
the decoder layers' finding and the loss tokens' sums moved to modules of their own, each
the very object of its new home."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("transformers")

#: each name ``datacentric.models.hf`` held that moved, and where it lives now (its
#: private ``_layer_layout`` moved with ``decoder_layers``: nothing imported it from hf)
MOVED = {
    "UnsupportedModelFeature": "hf_attention",
    "ATTENTION_NAME": "hf_attention",
    "_PACKED_CALL": "hf_attention",
    "packed_attention_forward": "hf_attention",
    "REFUSED_KWARGS": "hf_attention",
    "register_attention": "hf_attention",
    "decoder_layers": "hf_layers",
    "_layer_signature": "hf_layers",
    "loss_token_sums": "token_metrics",
}
#: the public names ``hf`` still defines: the wrapper, its checks and its builds
KEPT = [
    "ATTENTION_DROPOUT_SETTINGS",
    "ATTENTION_LAYER_TYPES",
    "HFCausalLM",
    "POSITION_LOCAL_ROPE_TYPES",
    "ROUTER_AUX_MODELS",
    "Refusal",
    "SMALL_LLAMA",
    "TINY_CONFIGS",
    "attention_heads",
    "build_hf_llama",
    "build_hf_model",
    "build_hf_source",
    "check_supported",
    "check_weight_files",
    "folder_config",
    "rope_types",
    "small_copy",
    "source_config",
    "tiny_hf_config",
]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_hf_still_gives_each_name_as_its_new_home_defines_it(name):
    hf = importlib.import_module("datacentric.models.hf")
    home = importlib.import_module(f"datacentric.models.{MOVED[name]}")
    assert getattr(hf, name) is getattr(home, name)
    if callable(getattr(home, name)):  # a class or function says where it is defined
        assert getattr(home, name).__module__ == home.__name__


def test_hf_lists_every_public_name_it_had():
    hf = importlib.import_module("datacentric.models.hf")
    public = [name for name in MOVED if not name.startswith("_")]
    assert sorted(hf.__all__) == sorted([*public, *KEPT])
    for name in KEPT:
        value = getattr(hf, name)
        assert not callable(value) or name == "Refusal" or value.__module__ == hf.__name__


def test_the_public_table_names_the_home_of_unsupported_model_feature():
    import datacentric.models as models

    assert (
        models.UnsupportedModelFeature
        is importlib.import_module("datacentric.models.hf_attention").UnsupportedModelFeature
    )
