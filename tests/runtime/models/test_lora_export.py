"""LoRA adapters leave a run in the formats their libraries load: a PEFT adapter folder
(``PeftModel.from_pretrained``), diffusers LoRA weights (a pipeline's
``load_lora_weights``), and ``--merge`` as peft's own ``merge_and_unload``."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

from chat_data import tiny_qwen2_config  # noqa: E402
from cli_here import cli_json_here  # noqa: E402

from datacentric.models.lora import apply_lora, draw_adapter_weights, lora_spec  # noqa: E402
from datacentric.train.exporting.lora_export import (  # noqa: E402
    DIFFUSERS_WEIGHTS,
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    merged_state,
    transposed_layers,
    write_adapter,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _qwen2():
    from transformers import Qwen2ForCausalLM

    config = tiny_qwen2_config()
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _adapted(base):
    from datacentric.models.hf import HFCausalLM

    model = apply_lora(HFCausalLM(copy.deepcopy(base)), lora_spec(4, 8.0, 0.0, "q_proj,v_proj"))
    draw_adapter_weights(model, seed=1)
    return model


def test_a_peft_adapter_folder_loads_onto_the_base_model(tmp_path) -> None:
    from peft import PeftModel

    base = _qwen2()
    base.save_pretrained(tmp_path / "base")
    model = _adapted(base).eval()
    (tmp_path / "a").mkdir()
    count = write_adapter(model.state_dict(), model.lora_spec, "hf", "base", tmp_path / "a")
    assert {p.name for p in (tmp_path / "a").iterdir()} == {PEFT_CONFIG, PEFT_WEIGHTS}
    assert count == 2 * 4 * ((32 + 32) + (32 + 16))  # layers x rank x (q: in + out, v: in + out)
    loaded = PeftModel.from_pretrained(_qwen2(), tmp_path / "a").eval()
    ours = {
        k[3:]: v for k, v in model.state_dict().items() if k.startswith("hf.") and ".lora_" in k
    }
    theirs = {k: v for k, v in loaded.get_base_model().state_dict().items() if ".lora_" in k}
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        torch.testing.assert_close(theirs[name], value, rtol=0, atol=0)
    ids = torch.randint(0, 64, (1, 12))
    model.hf.set_attn_implementation("sdpa")  # plain transformers use, as the user's load
    torch.testing.assert_close(loaded(input_ids=ids).logits, model.hf(input_ids=ids).logits)
    # the base weights on disk are untouched, the adapters moved the output
    assert not torch.allclose(loaded(input_ids=ids).logits, _qwen2()(input_ids=ids).logits)


def test_merge_folds_the_adapters_as_peft_merge_and_unload(tmp_path) -> None:
    import peft

    model = _adapted(_qwen2())
    own = {k[3:]: v for k, v in model.state_dict().items() if k.startswith("hf.")}
    merged = merged_state(own, model.lora_spec)
    wrapped = peft.get_peft_model(
        _qwen2(), peft.LoraConfig(r=4, lora_alpha=8.0, target_modules=["q_proj", "v_proj"])
    )
    wrapped.get_base_model().load_state_dict(own)
    reference = wrapped.merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(merged[name], value, rtol=1e-6, atol=1e-7)


def _gpt2():
    from transformers import GPT2LMHeadModel

    from datacentric.models.hf import tiny_hf_config

    torch.manual_seed(0)
    return GPT2LMHeadModel(tiny_hf_config("gpt2")).eval()


def test_a_gpt2_conv1d_merge_and_adapter_folder_load_as_peft_s(tmp_path) -> None:
    """GPT-2's ``c_attn`` and ``c_proj`` are transformers ``Conv1D`` (weight ``in x
    out``; the attention's ``c_proj`` is square, so shapes cannot tell): the merge adds
    the transposed update, as peft's ``merge_and_unload``, and loads in
    ``from_pretrained`` with the adapted model's logits; the adapter folder says
    ``fan_in_fan_out`` and loads in ``PeftModel.from_pretrained`` unwarned."""
    import json
    import warnings

    import peft
    from transformers import GPT2LMHeadModel

    from datacentric.models.hf import HFCausalLM

    base = _gpt2()
    model = apply_lora(HFCausalLM(copy.deepcopy(base)), lora_spec(4, 8.0, 0.0, "c_attn,c_proj"))
    draw_adapter_weights(model, seed=1)  # a non-zero B
    model.eval().hf.set_attn_implementation("sdpa")  # called as transformers calls it
    own = {k[3:]: v for k, v in model.state_dict().items() if k.startswith("hf.")}
    transposed = transposed_layers(model.hf)
    assert "transformer.h.0.attn.c_proj" in transposed  # 64 x 64
    assert len(transposed) == 3 * base.config.n_layer  # c_attn, attn.c_proj, mlp.c_proj
    merged = merged_state(own, model.lora_spec, transposed)
    targets = ["c_attn", "c_proj"]
    config = peft.LoraConfig(r=4, lora_alpha=8.0, target_modules=targets, fan_in_fan_out=True)
    wrapped = peft.get_peft_model(copy.deepcopy(base), config)
    wrapped.get_base_model().load_state_dict(own)
    reference = wrapped.merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(merged[name], value, rtol=1e-6, atol=1e-7)
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        adapted = model.hf(input_ids=ids).logits
        base.save_pretrained(tmp_path / "base")
        plain = GPT2LMHeadModel.from_pretrained(tmp_path / "base")
        plain.load_state_dict(merged)
        plain.save_pretrained(tmp_path / "merged")
        loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, adapted)
        assert not torch.allclose(adapted, base(input_ids=ids).logits)  # the adapters count
    (tmp_path / "a").mkdir()
    state, spec = model.state_dict(), model.lora_spec  # the run's names (hf.)
    write_adapter(state, spec, "hf", "base", tmp_path / "a", transposed_layers(model))
    assert json.loads((tmp_path / "a" / PEFT_CONFIG).read_text())["fan_in_fan_out"] is True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reloaded = peft.PeftModel.from_pretrained(_gpt2(), tmp_path / "a").eval()
    # peft corrects a false one with "fan_in_fan_out is set to False but ... Conv1D"
    assert not [w for w in caught if "fan_in_fan_out" in str(w.message)]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, adapted)


@pytest.mark.slow
def test_a_gpt2_lora_run_exports_merged_and_as_an_adapter(tmp_path, capsys) -> None:
    """``export --merge`` of a GPT-2 LoRA run (default targets: ``c_attn``, a
    ``Conv1D``) loads in ``from_pretrained`` with the run's logits, and its adapter
    folder in ``PeftModel.from_pretrained`` (no ``fan_in_fan_out`` warning) too."""
    import json
    import warnings

    from peft import PeftModel
    from transformers import GPT2LMHeadModel

    from datacentric.models.source import build_model_named
    from datacentric.train.checkpoints.checkpoint_load import read_model_state

    data = tmp_path / "docs.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"the quick brown fox {i}"}) + "\n" for i in range(16))
    )
    run = tmp_path / "run"
    cli_json_here([
        "train", "--model", "hf:gpt2", "--dataset", f"jsonl:{data}", "--iterations", "1",
        "--training.lr", "1e-2", "--lora.rank", "4", "--cost-model", "analytic",
        "--memory-gb", "2", "--no-progress", "--out", str(run), "--json",
    ], capsys)  # fmt: skip
    for out, flags in (("adapter", []), ("merged", ["--merge"])):
        cli_json_here(["export", str(run), "--out", str(tmp_path / out), *flags, "--json"], capsys)
    model = apply_lora(build_model_named("hf:gpt2"), lora_spec(4))
    checkpoint = run / "checkpoints" / "step-00000001"
    state = {k.removeprefix("hf."): v for k, v in read_model_state(checkpoint).items()}
    model.hf.load_state_dict(state, strict=False)  # lm_head: the tied embedding
    assert any(float(v.abs().max()) > 0 for k, v in state.items() if ".lora_B." in k)
    model.eval().hf.set_attn_implementation("sdpa")
    base = GPT2LMHeadModel(model.hf.config)
    base.load_state_dict({k.replace(".base_layer", ""): v for k, v in state.items()}, strict=False)
    ids = torch.randint(0, 256, (1, 16))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapter = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
        merged = GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
        adapted = model.hf(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted)
        torch.testing.assert_close(adapter(input_ids=ids).logits, adapted)
    assert not [w for w in caught if "fan_in_fan_out" in str(w.message)]


def test_a_llama_merge_and_adapter_config_are_unchanged(tmp_path) -> None:
    """nn.Linear targets: nothing transposed, ``fan_in_fan_out`` false."""
    import json

    from datacentric.models.source import build_model_named

    torch.manual_seed(0)
    model = apply_lora(build_model_named("hf:llama"), lora_spec(4))
    draw_adapter_weights(model, seed=1)
    assert transposed_layers(model) == frozenset()
    state = model.state_dict()
    merged = merged_state(state, model.lora_spec, transposed_layers(model))
    name = "hf.model.layers.0.self_attn.q_proj"
    a, b = state[f"{name}.lora_A.default.weight"], state[f"{name}.lora_B.default.weight"]
    expected = state[f"{name}.base_layer.weight"].double() + (b.double() @ a.double())
    torch.testing.assert_close(merged[f"{name}.weight"], expected.float(), rtol=0, atol=0)
    (tmp_path / "a").mkdir()
    write_adapter(state, model.lora_spec, "hf", "base", tmp_path / "a", transposed_layers(model))
    assert json.loads((tmp_path / "a" / PEFT_CONFIG).read_text())["fan_in_fan_out"] is False


def test_diffusers_lora_weights_load_into_a_pipeline_every_tensor(tmp_path) -> None:
    pytest.importorskip("diffusers")
    from diffusers import WanPipeline

    from datacentric.models.source import build_model_named

    torch.manual_seed(0)
    model = apply_lora(build_model_named("diffusers:wan"), lora_spec(4))
    draw_adapter_weights(model, seed=2)
    write_adapter(model.state_dict(), model.lora_spec, "diffusers", "wan", tmp_path)
    assert (tmp_path / DIFFUSERS_WEIGHTS).is_file()
    fresh = type(model.transformer).from_config(model.transformer.config)
    pipe = WanPipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=fresh
    )
    pipe.load_lora_weights(str(tmp_path), adapter_name="trained")
    loaded = {k: v for k, v in fresh.state_dict().items() if ".lora_" in k}
    ours = {
        k.removeprefix("transformer.").replace(".default.", ".trained."): v
        for k, v in model.state_dict().items()
        if ".lora_" in k
    }
    assert loaded.keys() == ours.keys() and len(ours) == 64
    for name, value in ours.items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=0)


def test_diffusers_lora_loads_at_the_trained_scale_in_the_pipeline(tmp_path) -> None:
    """alpha 8, rank 4 (scale 2): the pipeline's ``load_lora_weights`` reads no alpha and
    runs the adapters at scale 1, so the export bakes the scale in; the pipeline's
    transformer then gives the trained model's output."""
    pytest.importorskip("diffusers")
    from diffusers import WanPipeline

    from datacentric.models.source import build_model_named

    torch.manual_seed(0)
    model = build_model_named("diffusers:wan")
    fresh = type(model.transformer).from_config(model.transformer.config)
    fresh.load_state_dict(model.transformer.state_dict())  # the base weights
    apply_lora(model, lora_spec(4, 8.0))
    draw_adapter_weights(model, seed=2)
    write_adapter(model.state_dict(), model.lora_spec, "diffusers", "wan", tmp_path)
    pipe = WanPipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=fresh
    )
    pipe.load_lora_weights(str(tmp_path))
    generator = torch.Generator().manual_seed(3)
    inputs = {
        "hidden_states": torch.randn(1, 4, 2, 4, 4, generator=generator),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": torch.randn(1, 5, 32, generator=generator),
        "return_dict": False,
    }
    with torch.no_grad():
        trained = model.eval().transformer(**inputs)[0]
        loaded = pipe.transformer.eval()(**inputs)[0]
        pipe.transformer.disable_lora()
        base = pipe.transformer(**inputs)[0]
    torch.testing.assert_close(loaded, trained, rtol=1e-5, atol=1e-5)
    assert (loaded - base).abs().max() > 100 * (loaded - trained).abs().max()  # adapters count


@pytest.mark.slow
def test_a_lora_run_on_diffusers_latents_exports_weights_a_pipeline_loads(tmp_path, capsys) -> None:
    """The fine-tuning issue's diffusers case: LoRA on a saved Wan folder trained on latents
    at world 2, exported, and loaded by the pipeline's own ``load_lora_weights``."""

    diffusers = pytest.importorskip("diffusers")
    from safetensors.torch import load_file
    from test_model_source import _latent_folder

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width

    class_name, config = TINY_DIFFUSERS["wan"]
    cls = getattr(diffusers, class_name)
    torch.manual_seed(2)
    cls.from_config(config).save_pretrained(tmp_path / "wan")
    _latent_folder(tmp_path / "latents", config["in_channels"], text_width(config))
    run, out = tmp_path / "run", tmp_path / "lora"
    cli_json_here([
        "train", "--model", f"diffusers:{tmp_path / 'wan'}", "--dataset",
        f"latents:{tmp_path / 'latents'}", "--world", "2", "--iterations", "2",
        "--lora.rank", "4", "--training.lr", "1e-2", "--cost-model", "analytic",
        "--no-progress", "--out", str(run), "--json",
    ], capsys)  # fmt: skip
    summary = cli_json_here(["export", str(run), "--out", str(out), "--json"], capsys)
    assert summary["format"] == "diffusers-lora"
    exported = load_file(str(out / DIFFUSERS_WEIGHTS))
    fresh = cls.from_pretrained(tmp_path / "wan")
    pipe = diffusers.WanPipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=fresh
    )
    pipe.load_lora_weights(str(out), adapter_name="trained")
    loaded = {k: v for k, v in fresh.state_dict().items() if ".lora_" in k}
    assert len(loaded) == len(exported) > 0  # every exported tensor found its place
    for name, value in exported.items():
        key = name.removeprefix("transformer.").replace(".weight", ".trained.weight")
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)
    assert any(float(v.abs().sum()) > 0 for k, v in exported.items() if ".lora_B." in k)


def _held_out_loss(model, tokenizer_file, texts) -> float:  # noqa: ANN001
    """Mean next-token loss of ``model`` over ``texts``, one document at a time."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    losses = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            losses.append(model(input_ids=ids, labels=ids).loss.double())
    return float(torch.stack(losses).mean())


@pytest.mark.slow
def test_a_merged_lm_head_adapter_of_a_tied_model_loads_as_trained(tmp_path, capsys) -> None:
    """LoRA on ``lm_head`` of a Qwen2 whose head is its input embedding: ``export
    --merge`` writes an untied head holding the update (the embedding unchanged), and
    the merged folder's held-out loss is the adapter's."""
    import json

    from peft import PeftModel
    from test_model_source import _pretrained_folder
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder, tied=True)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:48]))
    run = tmp_path / "run"
    cli_json_here([
        "train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}",
        "--tokenizer", str(folder / "tokenizer.json"), "--iterations", "2",
        "--training.lr", "1e-2", "--lora.rank", "4", "--lora.alpha", "8",
        "--lora.targets", "q_proj,lm_head", "--cost-model", "analytic", "--no-progress",
        "--out", str(run), "--json",
    ], capsys)  # fmt: skip
    for out, flags in (("adapter", []), ("merged", ["--merge"])):
        cli_json_here(["export", str(run), "--out", str(tmp_path / out), *flags, "--json"], capsys)
    base = AutoModelForCausalLM.from_pretrained(folder).eval()
    embed = base.get_input_embeddings().weight.detach().clone()
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert merged.config.tie_word_embeddings is False
    torch.testing.assert_close(merged.get_input_embeddings().weight, embed, rtol=0, atol=0)
    assert not torch.equal(merged.get_output_embeddings().weight, embed)  # the head's update
    held_out, tokenizer = texts[48:], folder / "tokenizer.json"
    adapter_loss = _held_out_loss(adapted, tokenizer, held_out)
    merged_loss = _held_out_loss(merged, tokenizer, held_out)
    base_loss = _held_out_loss(
        AutoModelForCausalLM.from_pretrained(folder).eval(), tokenizer, held_out
    )
    assert abs(adapter_loss - base_loss) > 1e-4  # the adapters moved the loss
    assert abs(merged_loss - adapter_loss) <= 1e-6 * abs(adapter_loss)


def _word_tokenizer(folder, texts) -> None:  # noqa: ANN001
    """A word-level ``tokenizer.json`` trained on ``texts`` in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.mark.slow
def test_an_adapter_export_carries_the_tokenizer_the_run_read_its_text_with(
    tmp_path, capsys
) -> None:
    """A LoRA run of a Llama folder that read its text with another ``--tokenizer``:
    the adapter folder holds that tokenizer (before: none, so a user took the base
    folder's, whose ids differ), ``AutoTokenizer`` of the adapter folder gives the run's
    ids, and ``PeftModel.from_pretrained`` still loads the adapter onto the base."""
    import json

    from peft import PeftModel
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    words = [" ".join(f"w{j % 13} t{i * j % 5}" for j in range(8)) for i in range(24)]
    texts = [f"doc {i}: {line}" for i, line in enumerate(words)]
    base, other = tmp_path / "llama", tmp_path / "other"
    _word_tokenizer(base, [t[::-1] for t in texts])  # the base folder's own: other ids
    _word_tokenizer(other, texts)
    config = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(base)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run = tmp_path / "run"
    cli_json_here([
        "train", "--model", f"hf:{base}", "--dataset", f"jsonl:{data}",
        "--tokenizer", str(other / "tokenizer.json"), "--iterations", "1",
        "--lora.rank", "4", "--cost-model", "analytic", "--no-progress",
        "--out", str(run), "--json",
    ], capsys)  # fmt: skip
    adapter = tmp_path / "adapter"
    summary = cli_json_here(["export", str(run), "--out", str(adapter), "--json"], capsys)
    assert summary["format"] == "peft-adapter"
    assert summary["tokenizer"] == str(other)
    assert {PEFT_CONFIG, PEFT_WEIGHTS, "tokenizer.json"} <= set(summary["files"])
    trained = Tokenizer.from_file(str(other / "tokenizer.json"))
    loaded = AutoTokenizer.from_pretrained(adapter)
    own = AutoTokenizer.from_pretrained(base)
    for text in texts[:4]:
        assert loaded(text).input_ids == trained.encode(text).ids
        assert own(text).input_ids != trained.encode(text).ids  # the mistake it saves
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    ids = torch.tensor([loaded(texts[0]).input_ids])
    with torch.no_grad():
        assert torch.isfinite(model.eval()(input_ids=ids).logits).all()
