"""A causal LM whose decoder layers are not one list of ``num_hidden_layers`` blocks is
refused naming the layout it has (the feature), not what the wrapper failed to find
(it said "found 0 module lists of 16 layers at the shallowest depth ([]), expected
exactly one"): HRM's two layer stacks run in recurrent cycles, LongCat-Flash's layers
holding two attention sublayers each; ``train`` says it in one line before ranks start."""

from __future__ import annotations

import json

import pytest
from cli_here import cli_here

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def _hrm():
    config = transformers.HrmTextConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_layers_per_stack=2,
        H_cycles=2,
        L_cycles=2,
    )
    return config, transformers.HrmTextForCausalLM


def _longcat():
    config = transformers.LongcatFlashConfig(
        vocab_size=300,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        ffn_hidden_size=64,
        expert_ffn_hidden_size=32,
        n_routed_experts=4,
        moe_topk=2,
        zero_expert_num=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
    )
    return config, transformers.LongcatFlashForCausalLM


CASES = {
    "hrm": (
        _hrm,
        "HrmTextForCausalLM: layer stacks run in recurrent cycles (model.L_module.layers "
        "of 2, model.H_module.layers of 2: num_hidden_layers=16 layer calls of 4 layers)",
    ),
    "longcat": (
        _longcat,
        "LongcatFlashForCausalLM: decoder layers holding 2 layers each (model.layers of 2, "
        "counted as num_hidden_layers=4; model.layers.0.self_attn, a list of 2): several "
        "attention sublayers in one layer",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_refusal_names_the_layer_layout(name):
    import torch

    from datacentric.models.hf import HFCausalLM
    from datacentric.models.hf_attention import UnsupportedModelFeature

    make, feature = CASES[name]
    if not all(hasattr(transformers, n) for n in ("HrmTextConfig", "LongcatFlashConfig")):
        pytest.skip("this transformers has no HRM or LongCat-Flash")
    config, cls = make()
    with torch.device("meta"):
        model = cls(config)
    with pytest.raises(UnsupportedModelFeature) as refused:
        HFCausalLM(model)
    message = str(refused.value)
    assert message.startswith(feature + ", which data-centric parallel cannot run"), message
    assert "found" not in message and "expected" not in message


def test_train_refuses_it_in_one_line_before_ranks_start(tmp_path, capsys):
    if not hasattr(transformers, "HrmTextConfig"):
        pytest.skip("this transformers has no HRM")
    config, _ = _hrm()
    folder = tmp_path / "hrm"
    config.save_pretrained(folder)  # a folder with only config.json: random weights
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": "a few words " * n}) + "\n" for n in (3, 5, 7)))
    argv = ["train", "--model", f"hf:{folder}", "--tokenizer", "bytes"]
    argv += ["--dataset", f"jsonl:{docs}", "--world", "2", "--cost-model", "analytic"]
    status, _, err = cli_here([*argv, "--no-progress", "--out", str(tmp_path / "run")], capsys)
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("datacentric train: ") and CASES["hrm"][1] in line, err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "run" / "config.json").exists()
