"""LoRA (peft) through the runtime: only the adapters train, and their gradients equal a
single-process peft reference of the unmodified model (``peft.get_peft_model`` for a
transformers model, diffusers' own ``add_adapter`` for a diffusers transformer)."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

from chat_data import tiny_qwen2_config  # noqa: E402

from datacentric.models.lora import (  # noqa: E402
    LoraError,
    LoraSpec,
    apply_lora,
    lora_spec,
    unwrap_peft,
)
from datacentric.verify.equivalence import check_equivalence  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _check(model: str, world: int, lora: LoraSpec, wrapper: str) -> dict:
    (report,) = check_equivalence([model], world, lora=lora, wrapper=wrapper, timeout_s=420)
    return _passed(report)


def _passed(report: dict) -> dict:
    """``report`` after checking it passed, on SP groups with accumulation, against
    peft's or diffusers' own adapters."""
    assert report["passed"], report
    assert report["max_rel_grad_err"] <= 1e-5
    assert max(report["sp_sizes"]) > 1 and max(report["accumulation_counts"]) > 1
    assert "peft" in report["reference"] or "diffusers" in report["reference"]
    return report


@pytest.mark.slow
def test_transformers_lora_matches_peft_at_world_2_under_fsdp2() -> None:
    report = _check("hf:qwen2", 2, lora_spec(4, 8.0, 0.0, "q_proj,v_proj"), "fsdp2")
    # only the adapters' gradients: 4 layers x 2 targets x (A, B)
    assert report["num_parameters"] == 4 * 2 * 2
    assert ".lora_" in report["worst_parameter"]


@pytest.mark.slow
def test_transformers_lora_matches_peft_at_world_4() -> None:
    _check("hf:llama", 4, lora_spec(2), "none")  # default targets: q, k, v, o


@pytest.mark.slow
def test_diffusers_lora_matches_add_adapter_at_world_2() -> None:
    report = _check("diffusers:wan", 2, lora_spec(4), "ddp")
    assert "to_out.0" in str(report["lora"]) or report["lora"]["targets"] is None


FSDP2_FAMILIES = ["wan", "flux", "hunyuan-video"]


@pytest.fixture(scope="module")
def world_4_fsdp2_reports() -> dict[str, dict]:
    """Each family's report, the three in one start of the 4 ranks (a start imports the
    diffusers models in each rank: most of a family's time)."""
    models = [f"diffusers:{name}" for name in FSDP2_FAMILIES]
    reports = check_equivalence(models, 4, lora=lora_spec(4), wrapper="fsdp2", timeout_s=420)
    return dict(zip(FSDP2_FAMILIES, reports, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", FSDP2_FAMILIES)
def test_diffusers_lora_matches_add_adapter_at_world_4_under_fsdp2(
    name: str, world_4_fsdp2_reports: dict[str, dict]
) -> None:
    """Wan, and the joint-attention families whose single-stream blocks FSDP2 wraps."""
    report = _passed(world_4_fsdp2_reports[name])
    assert report["model"] == f"diffusers:{name}" and report["world"] == 4, report
    assert report["wrapper"] == "fsdp2", report
    assert ".lora_" in report["worst_parameter"]


def test_lora_freezes_the_base_and_unwraps_peft_models() -> None:
    import peft
    from transformers import Qwen2ForCausalLM

    from datacentric.models.hf import HFCausalLM
    from datacentric.planning.spec_derivation import spec_of_model

    config = tiny_qwen2_config()
    model = apply_lora(HFCausalLM(Qwen2ForCausalLM(config)), lora_spec(4))
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    assert model.lora_spec.targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    spec = spec_of_model(model)
    assert spec.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    # a model the user adapted with peft is unwrapped to the same parameters
    wrapped = peft.get_peft_model(
        Qwen2ForCausalLM(config), peft.LoraConfig(r=2, target_modules=["q_proj"])
    )
    inner = HFCausalLM(wrapped)
    assert inner.hf is wrapped.get_base_model() is unwrap_peft(wrapped)
    with pytest.raises(LoraError, match="no module named nope"):
        apply_lora(HFCausalLM(Qwen2ForCausalLM(config)), lora_spec(4, targets="q_proj,nope"))
    with pytest.raises(LoraError, match="not an nn.Linear"):
        apply_lora(HFCausalLM(Qwen2ForCausalLM(config)), lora_spec(4, targets="self_attn"))
    assert lora_spec(0) is None


def test_data_centric_takes_a_peft_model_and_trains_only_its_adapters() -> None:
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    from datacentric import DataCentric
    from datacentric.data import StdlibCorpus
    from datacentric.parallel.groups import ProcessGroups

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    wrapped = peft.get_peft_model(
        LlamaForCausalLM(config), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    dataset = StdlibCorpus(max_tokens=64, limit=2)
    dc = DataCentric(
        wrapped,
        dataset,
        groups=ProcessGroups.local(),
        shard="none",
        prefetch=0,
        tokens_per_iteration=512,
    )
    try:
        for step in dc.steps(iterations=1):
            for micro in step:
                micro.backward(dc.model(micro.batch))
            step.finish()
    finally:
        dc.close()
    trained = {n for n, p in wrapped.named_parameters() if p.grad is not None}
    assert trained and trained == {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert all(".lora_" in n for n in trained)
    # the plan priced only the adapters
    cost = dc.pipeline.cost_model
    spec = getattr(cost, "spec", None) or cost.inner.spec
    assert spec.trainable_params == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def test_all_linear_adapts_the_modules_peft_all_linear_adapts() -> None:
    """``--lora.targets all-linear`` (peft's shorthand): the same modules as
    ``peft.get_peft_model(model, LoraConfig(target_modules="all-linear"))``, every
    attention and MLP projection but not the output head."""
    import peft
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import Qwen2ForCausalLM

    from datacentric.models.hf import HFCausalLM

    config = tiny_qwen2_config()
    reference = peft.get_peft_model(
        Qwen2ForCausalLM(config), peft.LoraConfig(r=4, target_modules="all-linear")
    ).get_base_model()
    expected = {n for n, m in reference.named_modules() if isinstance(m, BaseTunerLayer)}
    model = apply_lora(HFCausalLM(Qwen2ForCausalLM(config)), lora_spec(4, targets="all-linear"))
    adapted = {n for n, m in model.hf.named_modules() if isinstance(m, BaseTunerLayer)}
    assert adapted == expected and set(model.lora_spec.targets) == expected
    assert len(expected) == config.num_hidden_layers * 7 and "lm_head" not in expected
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n in dict(model.named_parameters()) if ".lora_" in n}
    assert lora_spec(4, targets="All-Linear").targets == ("all-linear",)
    with pytest.raises(LoraError, match="all-linear stands alone"):
        lora_spec(4, targets="all-linear,lm_head")


def test_a_fused_attention_model_gets_peft_default_targets_and_trains_and_loads(tmp_path) -> None:
    """GPT-2 (fused ``c_attn``, a transformers ``Conv1D``) has no ``q_proj``: LoRA
    adapts peft's own default for its model type, records it by name, trains one step
    and its adapter folder loads in ``PeftModel.from_pretrained``; a Llama keeps q, k,
    v, o; a Phi-3 (``qkv_proj``, no peft default here) is refused naming its
    attention's linear layers."""
    from peft import PeftModel
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    from transformers import GPT2LMHeadModel, Phi3Config, Phi3ForCausalLM

    from datacentric.models.hf import HFCausalLM, tiny_hf_config
    from datacentric.models.lora import draw_adapter_weights
    from datacentric.models.source import build_model_named
    from datacentric.train.build import what_trains
    from datacentric.train.exporting.lora_export import transposed_layers, write_adapter

    torch.manual_seed(0)
    base = GPT2LMHeadModel(tiny_hf_config("gpt2"))
    with warnings.catch_warnings():  # Conv1D is adapted as such (fan_in_fan_out), unwarned
        warnings.simplefilter("error")
        model = apply_lora(HFCausalLM(copy.deepcopy(base)), lora_spec(4))
    model.hf.set_attn_implementation("sdpa")  # called as transformers calls it
    expected = tuple(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["gpt2"])
    assert model.lora_spec.targets == expected == ("c_attn",)
    assert " on c_attn: " in what_trains(model)
    ids = torch.randint(0, 256, (1, 16))
    model.hf(input_ids=ids, labels=ids).loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(".lora_" in n for n in grads)
    draw_adapter_weights(model, seed=1)
    transposed = transposed_layers(model)
    write_adapter(model.state_dict(), model.lora_spec, "hf", "base", tmp_path, transposed)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["fan_in_fan_out"]
    loaded = PeftModel.from_pretrained(base, tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids).logits, model.hf.eval()(input_ids=ids).logits
        )
    llama = apply_lora(build_model_named("hf:llama"), lora_spec(4))
    assert llama.lora_spec.targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    phi3 = Phi3Config(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    peft_phi3 = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get("phi3")
    if peft_phi3 is None:
        with pytest.raises(LoraError, match=r"'phi3': none.*o_proj, qkv_proj.*all-linear"):
            apply_lora(HFCausalLM(Phi3ForCausalLM(phi3)), lora_spec(4))
    else:  # a peft that knows Phi-3
        adapted = apply_lora(HFCausalLM(Phi3ForCausalLM(phi3)), lora_spec(4))
        assert adapted.lora_spec.targets == tuple(peft_phi3)
    adapted = apply_lora(HFCausalLM(Phi3ForCausalLM(phi3)), lora_spec(4, targets="qkv_proj,o_proj"))
    assert " on qkv_proj,o_proj: " in what_trains(adapted)
