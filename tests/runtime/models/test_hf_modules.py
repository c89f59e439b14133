"""``datacentric.models.hf`` keeps every name it had before the attention implementation,
the decoder layers' finding, the loss tokens' sums, the tiny configs and the forward on a
packed batch moved to modules of their own, each the very object of its new home."""

from __future__ import annotations

import importlib

import pytest
from moved_names import assert_given_as_defined

pytest.importorskip("transformers")

#: each name ``datacentric.models.hf`` held that moved, and where it lives now (its
#: private ``_layer_layout`` moved with ``decoder_layers``, and ``_PACKED_CALL`` is read
#: by ``hf_forward`` now: nothing imported them from hf)
MOVED = {
    "UnsupportedModelFeature": "hf_attention",
    "ATTENTION_NAME": "hf_attention",
    "packed_attention_forward": "hf_attention",
    "REFUSED_KWARGS": "hf_attention",
    "register_attention": "hf_attention",
    "decoder_layers": "hf_layers",
    "_layer_signature": "hf_layers",
    "loss_token_sums": "token_metrics",
    "SMALL_LLAMA": "hf_tiny",
    "TINY_CONFIGS": "hf_tiny",
}
#: the public names ``hf`` still defines: the wrapper, its checks and its builds
KEPT = [
    "ATTENTION_DROPOUT_SETTINGS",
    "ATTENTION_LAYER_TYPES",
    "HFCausalLM",
    "POSITION_LOCAL_ROPE_TYPES",
    "ROUTER_AUX_MODELS",
    "Refusal",
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
#: the methods of :class:`HFCausalLM` that moved to its base ``hf_forward.PackedCausalLM``
FORWARD = ["logits", "_run", "forward", "router_aux_loss"]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_hf_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined("datacentric.models.hf", f"datacentric.models.{MOVED[name]}", name)


def test_hf_lists_every_public_name_it_had():
    hf = importlib.import_module("datacentric.models.hf")
    public = [name for name in MOVED if not name.startswith("_")]
    assert sorted(hf.__all__) == sorted([*public, *KEPT])
    for name in KEPT:
        value = getattr(hf, name)
        assert not callable(value) or name == "Refusal" or value.__module__ == hf.__name__


def test_the_wrapper_answers_each_moved_method_from_its_base():
    """No method of ``HFCausalLM``'s own, nor of ``nn.Module`` (whose ``forward`` comes
    after the base), hides one that moved."""
    from datacentric.models.hf import HFCausalLM
    from datacentric.models.hf_forward import PackedCausalLM

    for name in FORWARD:
        assert getattr(HFCausalLM, name) is vars(PackedCausalLM)[name], name
        assert name not in vars(HFCausalLM), name


def test_the_public_table_names_the_home_of_unsupported_model_feature():
    import datacentric.models as models

    assert (
        models.UnsupportedModelFeature
        is importlib.import_module("datacentric.models.hf_attention").UnsupportedModelFeature
    )
