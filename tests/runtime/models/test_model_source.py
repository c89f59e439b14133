"""The one model resolver (``--model``), model arguments, the analytic spec of any model,
the checks made before ranks start, and export back to the format a model came in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_here import cli_here, cli_json_here

from datacentric.models.source import (
    ModelSourceError,
    build_model_named,
    parse_model_args,
    resolve_model,
)
from datacentric.planning.spec_derivation import spec_of_model
from datacentric.profiling.factory import named_spec
from datacentric.profiling.profiler import truncate_blocks


def test_model_strings_resolve_or_name_what_is_wrong(tmp_path: Path) -> None:
    assert resolve_model("llama").kind == "preset"
    assert resolve_model("hf:qwen2").kind == "hf"
    assert resolve_model("tests.user_models:tiny_gpt", ["layers=1"]).args == {"layers": 1}
    with pytest.raises(ModelSourceError, match="unknown model 'lama'"):
        resolve_model("lama")
    with pytest.raises(ModelSourceError, match="no folder 'nowhere'.*tiny names: .*qwen2"):
        resolve_model("hf:nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="holds no config.json"):
        resolve_model(f"hf:{tmp_path / 'empty'}")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="only pickled \\*.bin weights"):
        resolve_model(f"hf:{pickled}")
    with pytest.raises(ModelSourceError, match="not KEY=VALUE"):
        parse_model_args(["num_heads"])
    assert parse_model_args(["a=2", "b=0.5", "c=true", "d=text"]) == {
        "a": 2,
        "b": 0.5,
        "c": True,
        "d": "text",
    }


def test_a_model_folder_without_its_prefix_is_refused_naming_the_prefix(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--model my-model``, a folder holding a model, says ``hf:my-model`` (or
    ``diffusers:``) and still lists every other kind of model string."""
    monkeypatch.chdir(tmp_path)
    folders = {"my-model": {"model_type": "llama"}, "wan": {"_class_name": "WanTransformer3DModel"}}
    for name, config in folders.items():
        Path(name).mkdir()
        (Path(name) / "config.json").write_text(json.dumps(config))
    Path("pipe").mkdir()
    (Path("pipe") / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    Path("other").mkdir()
    (Path("other") / "config.json").write_text("{}")
    others = r"use a preset \(llama, .*hf:DIR_OR_NAME, diffusers:DIR_OR_NAME or pkg.module:factory"
    for name, prefix in (("my-model", "hf:"), ("wan", "diffusers:"), ("pipe", "diffusers:")):
        with pytest.raises(ModelSourceError, match=f"give --model {prefix}{name}; or {others}"):
            resolve_model(name)
    with pytest.raises(ModelSourceError) as err:
        resolve_model("other")  # a config.json of no model kind: no prefix to suggest
    assert "give --model" not in str(err.value) and "unknown model 'other'; use a" in str(err.value)
    Path("lengths.txt").write_text("100\n200\n")
    command = ["schedule", "--model", "my-model", "--hardware", "h100-sxm", "--world", "2"]
    status, _, err_text = cli_here([*command, "--lengths", "lengths.txt"], capsys)
    assert status == 2 and "Hugging Face transformers model" in err_text
    assert "give --model hf:my-model; or use a preset" in err_text


def test_model_arguments_are_checked_against_what_the_model_takes() -> None:
    model = build_model_named("llama", ["num_heads=2"], device="meta")
    assert model.num_heads == 2
    with pytest.raises(ModelSourceError, match="llama takes no num_head .*num_heads"):
        build_model_named("llama", ["num_head=2"], device="meta")
    with pytest.raises(ModelSourceError, match="factory tests.user_models:tiny_gpt takes no x"):
        build_model_named("tests.user_models:tiny_gpt", ["x=1"], device="meta")
    with pytest.raises(ModelSourceError, match="hf:qwen2's config takes no bogus"):
        build_model_named("hf:qwen2", ["bogus=1"], device="meta")
    qwen = build_model_named("hf:qwen2", ["num_hidden_layers=2"], device="meta")
    assert len(qwen.blocks) == 2


def test_a_users_model_is_priced_from_its_parameter_shapes() -> None:
    model = build_model_named("tests.user_models:tiny_gpt", ["width=64", "heads=4"])
    spec = spec_of_model(model, "tiny_gpt")
    assert (spec.hidden, spec.heads, spec.ffn_hidden, spec.num_blocks) == (64, 4, 256, 2)
    assert spec.block_kinds == ("causal", "causal") and spec.vocab_size == 256
    # every parameter the model has is counted (memory), the generic count plus the rest
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    # a model with a config is read from it; a preset name with arguments is built
    assert named_spec("hf:qwen2").kv_heads == 2
    assert named_spec("llama", {"num_heads": 2}).heads == 2


def _resave(source: Path, folder: Path, change) -> Path:  # noqa: ANN001
    """``source`` copied to ``folder`` with ``change(tensors)`` applied to its weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    file = next(folder.glob("*.safetensors"))
    save_file(change(load_file(file)), file, metadata={"format": "pt"})
    return folder


def test_weights_that_leave_parameters_unset_are_refused_naming_them(tmp_path: Path) -> None:
    """transformers and diffusers start a parameter the files lack (or hold at another
    shape) from random values and only log it: the build refuses, naming the tensors."""
    from datacentric.models.diffusers_build import build_diffusers_model

    torch.manual_seed(0)
    build_model_named("hf:llama", ["num_hidden_layers=1"]).hf.save_pretrained(tmp_path / "full")
    assert len(build_model_named(f"hf:{tmp_path / 'full'}").blocks) == 1  # all there: loads
    cases = {
        "lost": (lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"}, "lm_head"),
        "prefixed": (
            lambda t: {f"module.{k}": v for k, v in t.items()},
            r"\(lm_head.weight, .*unused \(module.lm_head.weight",
        ),
        "reshaped": (
            lambda t: {**t, "model.norm.weight": torch.ones(3)},
            r"model.norm.weight is \(3,\) there but \(64,\)",
        ),
    }
    for name, (change, named) in cases.items():
        folder = _resave(tmp_path / "full", tmp_path / name, change)
        with pytest.raises(ModelSourceError, match=f"do not fit LlamaForCausalLM: .*{named}"):
            build_model_named(f"hf:{folder}")
    build_diffusers_model("wan").transformer.save_pretrained(tmp_path / "wan")
    lost = next(iter(build_diffusers_model(str(tmp_path / "wan")).transformer.state_dict()))
    drop = lambda t: {k: v for k, v in t.items() if k != lost}  # noqa: E731
    folder = _resave(tmp_path / "wan", tmp_path / "wan-lost", drop)
    with pytest.raises(ModelSourceError, match=f"WanTransformer3DModel: .*\\({lost}\\)"):
        build_diffusers_model(str(folder))
    norm = "blocks.0.attn1.norm_k.weight"  # at another shape: named with both shapes
    folder = _resave(
        tmp_path / "wan", tmp_path / "wan-reshaped", lambda t: {**t, norm: torch.ones(3)}
    )
    with pytest.raises(ModelSourceError, match=f"{norm} is \\(3,\\) there but"):
        build_diffusers_model(str(folder))


def test_truncated_blocks_reach_the_wrapped_models_own_layer_list() -> None:
    model = build_model_named("hf:qwen2", device="meta")
    truncate_blocks(model, 1)
    assert len(model.blocks) == 1 and len(model.hf.model.layers) == 1


@pytest.mark.slow
def test_bad_model_input_is_one_line_before_ranks_start(tmp_path: Path, capsys) -> None:
    """The command in this process (the checks run before any rank starts)."""
    from transformers import AutoConfig

    from datacentric.cli.main import main

    longrope = tmp_path / "phi3-longrope"  # a config alone: the check reads no weights
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}
    AutoConfig.for_model(
        "phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=256, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
        original_max_position_embeddings=112, max_position_embeddings=4096,
        rope_scaling={**rope, "original_max_position_embeddings": 112},
    ).save_pretrained(longrope)  # fmt: skip
    for argv, expected in (
        (["--model", f"hf:{longrope}"], "LongRoPE"),
        (["--model", "hf:nowhere"], "no folder 'nowhere'"),
        (["--model", "llama", "--model-arg", "num_head=2"], "takes no num_head"),
        (["--model", "tests.user_models:missing"], "has no callable 'missing'"),
    ):
        status = main(["train", *argv, "--world", "2", "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert status == 2, err
        lines = err.strip().splitlines()  # (transformers may warn before it)
        ours = [line for line in lines if line.startswith("datacentric train: ")]
        assert len(ours) == 1 and ours[0] == lines[-1], lines
        assert expected in ours[0]


def _train_and_export(tmp_path: Path, capsys, model: str, *data_flags: str) -> tuple[Path, dict]:
    """``train`` 3 steps at world 2 with lr 1e-6 (analytic cost model), then ``export``,
    both in this process; the exported folder and what ``export`` reports (format,
    parameters, ...)."""
    run_dir, exported = tmp_path / "run", tmp_path / "exported"
    summary = cli_json_here([
        "train", "--model", model, *data_flags, "--world", "2", "--iterations", "3",
        "--training.lr", "1e-6", "--cost-model", "analytic", "--no-progress",
        "--out", str(run_dir), "--json",
    ], capsys)  # fmt: skip
    assert summary["iterations_done"] == 3
    return exported, cli_json_here(
        ["export", str(run_dir), "--out", str(exported), "--json"], capsys
    )


def _pretrained_folder(folder: Path, tied: bool = False) -> list[str]:
    """A 2-layer Qwen2 saved with save_pretrained, its own tokenizer beside it, and 60
    short documents; returns the texts. ``tied``: its head is its input embedding
    (``tie_word_embeddings``, as the small Qwen2 models)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM

    texts = [
        f"document {i}: " + " ".join(f"word{j % 37} tok{(i * j) % 11}" for j in range(5 + 3 * i))
        for i in range(60)
    ]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(1)
    config = AutoConfig.for_model(
        "qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=4096,
        tie_word_embeddings=tied,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return texts


@pytest.mark.slow
def test_a_pretrained_folder_trains_and_exports_as_a_loadable_hf_model(
    tmp_path: Path, capsys
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text(
        "{% for m in messages %}TOOL {{ m['content'] }}\n{% endfor %}"
    )
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    exported, summary = _train_and_export(
        tmp_path, capsys, f"hf:{folder}", "--dataset", f"jsonl:{data}",
        "--tokenizer", str(folder / "tokenizer.json"),
    )  # fmt: skip
    assert summary["format"] == "transformers"
    assert (exported / "tokenizer.json").is_file()
    # the tokenizer loads from the export as from the user's folder: its chat template
    # and its named templates (additional_chat_templates/) render alike
    users, ours = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(exported)
    chat = [{"role": "user", "content": "word1 tok2"}]
    for name in (None, "tool_use"):
        want = users.apply_chat_template(chat, chat_template=name, tokenize=False)
        assert ours.apply_chat_template(chat, chat_template=name, tokenize=False) == want
    assert "TOOL" in ours.apply_chat_template(chat, chat_template="tool_use", tokenize=False)
    before = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    loaded = AutoModelForCausalLM.from_pretrained(exported)
    assert summary["parameters"] == sum(p.numel() for p in loaded.parameters())
    after = loaded.state_dict()
    assert sorted(before) == sorted(after)
    moved = False
    for name, weight in before.items():
        # relative to the pretrained tensor (absolute for tensors initialised to zero)
        scale = max(float(weight.norm()), 1.0)
        change = float((after[name] - weight).norm()) / scale
        assert change <= 1e-3, (name, change)  # loaded, not re-initialised
        moved |= change > 0
    assert moved  # and trained
    # export refuses to overwrite a folder it did not make
    status, _, err = cli_here(["export", str(tmp_path / "run"), "--out", str(exported)], capsys)
    assert status == 2 and "not empty" in err


@pytest.mark.slow
def test_a_users_factory_trains_with_no_cost_model_given(tmp_path: Path, capsys) -> None:
    """The default cost model profiles the user's model on the run's own samples."""
    run_dir = tmp_path / "run"
    summary = cli_json_here([
        "train",
        "--model", "tests.user_models:tiny_gpt",
        "--model-arg", "layers=2",
        "--world", "2",
        "--iterations", "2",
        "--dataset-limit", "2",
        "--max-tokens", "128",
        "--global-batch-tokens", "4096",
        "--no-progress",
        "--out", str(run_dir),
        "--json",
    ], capsys)  # fmt: skip
    assert summary["iterations_done"] == 2
    profile = json.loads((run_dir / "profile" / "profile.json").read_text())
    identity = profile["fingerprint"]["model_config"]
    assert identity["class"] == "TinyGPT" and identity["args"] == {"layers": 2}
    status, _, err = cli_here(["export", str(run_dir), "--out", str(tmp_path / "exported")], capsys)
    assert status == 2 and "pass --model tests.user_models:tiny_gpt" in err
    assert not (tmp_path / "exported").exists()  # a factory runs only when named
    argv = ["--model", "tests.user_models:tiny_gpt", "--json"]
    status, _, err = cli_here(
        ["export", str(run_dir), "--out", str(tmp_path / "exported"), *argv], capsys
    )
    assert status == 0, err[-2000:]
    from safetensors.torch import load_file

    from tests.user_models import tiny_gpt

    state = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert sorted(state) == sorted(tiny_gpt(layers=2).state_dict())


def _latent_folder(
    folder: Path, channels: int, text_width: int, count: int = 12, max_frames: int = 3
) -> None:
    """Video latents (frames x channels x height x width, up to ``max_frames`` frames) with
    text embeddings beside them (``NAME.text.safetensors``), as docs/data.md describes."""
    from safetensors.torch import save_file

    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        frames, size = 1 + i % max_frames, 4 + 2 * (i % 2)
        latent = torch.randn(frames, channels, size, size, generator=generator)
        save_file({"latent": latent}, str(folder / f"clip{i:02d}.safetensors"))
        text = torch.randn(5, text_width, generator=generator)
        save_file({"latent": text}, str(folder / f"clip{i:02d}.text.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("tiny", ["wan", "ltx", "hunyuan-video"])
def test_a_diffusers_folder_trains_on_latents_and_exports_as_a_loadable_model(
    tmp_path: Path, capsys, tiny: str
) -> None:
    import diffusers

    from datacentric.models.diffusers_build import TINY_DIFFUSERS, text_width

    class_name, config = TINY_DIFFUSERS[tiny]
    cls = getattr(diffusers, class_name)
    torch.manual_seed(2)
    folder = tmp_path / tiny
    cls.from_config(config).save_pretrained(folder)  # Wan's needs accelerate to load
    latents = tmp_path / "latents"
    _latent_folder(latents, config["in_channels"], text_width(config))
    exported, summary = _train_and_export(
        tmp_path, capsys, f"diffusers:{folder}", "--dataset", f"latents:{latents}"
    )
    assert summary["format"] == "diffusers"
    before = cls.from_pretrained(folder).state_dict()
    loaded = cls.from_pretrained(exported)
    assert summary["parameters"] == sum(p.numel() for p in loaded.parameters())
    after = loaded.state_dict()
    assert sorted(before) == sorted(after)
    changes = {
        name: float((after[name] - w).norm()) / max(float(w.norm()), 1.0)
        for name, w in before.items()
    }
    assert max(changes.values()) <= 1e-3, max(changes.items(), key=lambda kv: kv[1])
    assert any(c > 0 for c in changes.values())


def test_an_export_carries_the_tokenizer_the_run_read_its_text_with_alone(tmp_path: Path) -> None:
    """`--tokenizer bytes` trains on UTF-8 byte ids: the model folder's tokenizer beside
    the export would give it other ids. Another `--tokenizer` is copied alone, not
    filled in with the model folder's files (special tokens, vocabularies of another)."""
    from datacentric.models.model_args import ModelSource
    from datacentric.train.exporting.export import _tokenizer_folders

    model, other = tmp_path / "model", tmp_path / "other"
    source = ModelSource(name=f"hf:{model}", kind="hf", target=str(model), folder=model)

    def folders(tokenizer: str | None, source: ModelSource = source) -> list[Path]:
        return _tokenizer_folders(source, {"data": {"tokenizer": tokenizer}})

    assert folders("bytes") == []
    other.mkdir()
    (other / "tokenizer.json").write_text("{}")
    assert folders(str(other / "tokenizer.json")) == [other]
    assert folders(str(other)) == [other]
    assert folders(None) == [model]
    tiny = ModelSource(name="hf:qwen2", kind="hf", target="qwen2")
    assert folders(None, tiny) == folders("bytes", tiny) == []
