"""``export`` run from another directory than the run's: the run recorded its model
folder and tokenizer as typed (``hf:my-model``), relative to where it was started, and
export finds them there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from cli_here import cli_here, cli_json_here

from datacentric.train.exporting.run_paths import start_dir


def _model_folder(folder: Path) -> Path:
    """A 2-layer Qwen2 saved with save_pretrained, a word-level tokenizer beside it;
    returns a JSONL of 40 short documents."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM

    texts = [
        f"document {i}: " + " ".join(f"w{j % 17} t{i * j % 7}" for j in range(9)) for i in range(40)
    ]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(1)
    config = AutoConfig.for_model(
        "qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    data = folder.parent / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return data


def test_export_from_another_directory_finds_the_runs_relative_model(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    from transformers import AutoModelForCausalLM

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    _model_folder(project / "my-model")
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    cli_json_here([
        "train", "--model", "hf:my-model", "--tokenizer", "my-model/tokenizer.json",
        "--dataset", "jsonl:docs.jsonl", "--iterations", "1", "--cost-model", "analytic",
        "--no-progress", "--out", "run", "--json",
    ], capsys)  # fmt: skip
    monkeypatch.chdir(elsewhere)
    # before: "model 'hf:my-model': no folder 'my-model' with a config.json ..."
    summary = cli_json_here(["export", "../project/run", "--out", "exported", "--json"], capsys)
    assert summary["format"] == "transformers"
    assert (elsewhere / "exported" / "tokenizer.json").is_file()  # the run's tokenizer
    loaded = AutoModelForCausalLM.from_pretrained(elsewhere / "exported")
    assert summary["parameters"] == sum(p.numel() for p in loaded.parameters())

    # the folder gone from where the run was started: one line naming both places
    shutil.move(project / "my-model", tmp_path / "moved")
    status, _, err = cli_here(["export", "../project/run", "--out", "again"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("datacentric export: ")]
    assert status == 2 and len(lines) == 1, err
    assert str(project / "my-model") in lines[0] and str(elsewhere / "my-model") in lines[0]
    assert not (elsewhere / "again").exists()


def test_a_run_recorded_without_its_start_directory_is_found_by_its_out() -> None:
    """A run of an earlier release kept no ``start_dir``: its ``--out``, typed relative,
    and where the run folder is now tell it."""
    run = Path("/home/u/project/runs/a")
    assert start_dir(run, {}, {"job": {"out": "runs/a"}}) == Path("/home/u/project")
    assert start_dir(run, {}, {"job": {"out": "./runs/a/"}}) == Path("/home/u/project")
    assert start_dir(run, {"start_dir": "/work"}, {"job": {"out": "runs/a"}}) == Path("/work")
    for out in ("/abs/runs/a", "other/a", "../runs/a", None):
        assert start_dir(run, {}, {"job": {"out": out}}) is None, out
