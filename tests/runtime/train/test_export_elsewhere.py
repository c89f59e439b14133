"""``export`` and ``train --resume`` run from another directory than the run's: the run
recorded its model folder, tokenizer and data as typed (``hf:my-model``), relative to
where it was started; export finds them there, and a resume compares the places they
name, not the words. And ``export --weights-dtype``: a bfloat16 folder trains float32 master
weights, exported as such unless told."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_here import cli_here, cli_json_here

from datacentric.train.checkpoints.run_paths import start_dir


def _model_folder(folder: Path) -> Path:
    """A 2-layer Qwen2 saved in bfloat16 with save_pretrained, a word-level tokenizer
    beside it; returns a JSONL of 40 short documents."""
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
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    data = folder.parent / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return data


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder holding ``my-model`` and ``run``, a run of one step of ``hf:my-model``
    started in it (its paths typed relative)."""
    from datacentric.cli.main import main

    project = tmp_path_factory.mktemp("trained") / "project"
    _model_folder(project / "my-model")
    here = os.getcwd()
    os.chdir(project)
    try:
        assert main([
            "train", "--model", "hf:my-model", "--tokenizer", "my-model/tokenizer.json",
            "--dataset", "jsonl:docs.jsonl", "--iterations", "1", "--cost-model", "analytic",
            "--no-progress", "--out", "run", "--json",
        ]) == 0  # fmt: skip
    finally:
        os.chdir(here)
    return project


def test_export_from_another_directory_finds_the_runs_relative_model(
    project: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    from transformers import AutoModelForCausalLM

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = os.path.relpath(project / "run")
    # before: "model 'hf:my-model': no folder 'my-model' with a config.json ..."
    summary = cli_json_here(["export", run, "--out", "exported", "--json"], capsys)
    assert summary["format"] == "transformers"
    assert (elsewhere / "exported" / "tokenizer.json").is_file()  # the run's tokenizer
    loaded = AutoModelForCausalLM.from_pretrained(elsewhere / "exported")
    assert summary["parameters"] == sum(p.numel() for p in loaded.parameters())

    # the folder gone from where the run was started: one line naming both places
    shutil.move(project / "my-model", tmp_path / "moved")
    try:
        status, _, err = cli_here(["export", run, "--out", "again"], capsys)
    finally:
        shutil.move(tmp_path / "moved", project / "my-model")
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
    assert start_dir(run, {"start_dir": "/srv/job"}, {"job": {"out": "runs/a"}}) == Path("/srv/job")
    for out in ("/abs/runs/a", "other/a", "../runs/a", None):
        assert start_dir(run, {}, {"job": {"out": out}}) is None, out


def test_export_writes_float32_weights_unless_a_dtype_is_given(
    project: Path, tmp_path: Path, capsys
) -> None:
    """The bfloat16 folder trained float32 master weights: exported as float32 (and its
    config says so) by default; ``--weights-dtype bfloat16`` writes them cast, config alike."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    def export(name: str, *flags: str) -> tuple[dict, dict[str, torch.Tensor]]:
        out = tmp_path / name
        cli_json_here(["export", str(project / "run"), "--out", str(out), "--json", *flags], capsys)
        config = json.loads((out / "config.json").read_text())
        return config, load_file(str(out / "model.safetensors"))

    config, weights = export("as-trained")
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert {w.dtype for w in weights.values()} == {torch.float32}
    config, cast = export("bf16", "--weights-dtype", "bfloat16")
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert sorted(cast) == sorted(weights)
    for name, weight in weights.items():
        assert torch.equal(cast[name], weight.to(torch.bfloat16)), name
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_a_run_s_tokenizer_gone_is_said_before_anything_is_written(
    project: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Exported where the run was started, with its ``--tokenizer`` file gone: one line
    naming it, and no folder written (before: a model folder with no tokenizer)."""
    monkeypatch.chdir(project)
    shutil.move(project / "my-model" / "tokenizer.json", tmp_path / "tokenizer.json")
    try:
        status, _, err = cli_here(["export", "run", "--out", str(tmp_path / "out")], capsys)
    finally:
        shutil.move(tmp_path / "tokenizer.json", project / "my-model" / "tokenizer.json")
    lines = [line for line in err.splitlines() if line.startswith("datacentric export: ")]
    assert status == 2 and len(lines) == 1, err
    assert "tokenizer 'my-model/tokenizer.json' is not there any more" in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_export_that_writes_no_tokenizer_needs_none(tmp_path: Path) -> None:
    """Only a transformers model (or its LoRA adapter) carries the run's tokenizer: the
    model's path is resolved for every export, the tokenizer's only where it is copied."""
    from datacentric.train.exporting.export import _paths_as_the_run_saw

    settings = {"model": {"model": "mypkg.mod:factory"}, "data": {"tokenizer": "tok/t.json"}}
    assert _paths_as_the_run_saw(settings, tmp_path / "gone", None) == settings


def _resume_from(elsewhere: Path, run: Path, *typed: str) -> list[str]:
    """``train --resume`` of ``run`` (two steps now) in ``elsewhere``: its model and
    tokenizer typed from there, then ``typed`` (the data)."""
    model = os.path.relpath(run.parent / "my-model", elsewhere)
    return [
        "train", "--model", f"hf:{model}", "--tokenizer", f"{model}/tokenizer.json", *typed,
        "--iterations", "2", "--cost-model", "analytic", "--no-progress",
        "--out", os.path.relpath(run, elsewhere), "--resume",
    ]  # fmt: skip


def test_a_resume_from_another_directory_compares_the_places_the_paths_name(
    project: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The same model folder, tokenizer and data typed from another directory resume
    (before: refused inside the ranks, "data.dataset ('jsonl:docs.jsonl' ->
    'jsonl:../project/docs.jsonl')"); the run's own words naming another file there,
    whose samples differ, are refused before any rank starts, in one line (before: by
    the dataset's fingerprint, inside the ranks), the run folder untouched."""
    from datacentric.train.checkpoints.checkpoint_folders import list_checkpoints

    run = project / "resumed"
    shutil.copytree(project / "run", run)  # the fixture's run stays as it is
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    other = [{"text": f"document {i}: w1 t2 w3 t4 w5"} for i in range(6)]
    (elsewhere / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in other))
    before = sorted(p.name for p in list_checkpoints(run))
    status, _, err = cli_here(_resume_from(elsewhere, run, "--dataset", "jsonl:docs.jsonl"), capsys)
    lines = [line for line in err.splitlines() if line.startswith("datacentric train: ")]
    assert status == 2 and "changed since it was saved: " in lines[-1], err
    assert "the dataset's samples" in lines[-1] and "data.dataset" not in lines[-1], lines[-1]
    assert "rank" not in lines[-1], lines[-1]
    assert sorted(p.name for p in list_checkpoints(run)) == before

    data = os.path.relpath(project / "docs.jsonl", elsewhere)
    status, _, err = cli_here(_resume_from(elsewhere, run, "--dataset", f"jsonl:{data}"), capsys)
    assert status == 0, err
    assert sorted(p.name for p in list_checkpoints(run)) > before  # step 2 was saved


def test_a_resume_compares_paths_where_its_checkpoint_says_where_the_run_started(
    tmp_path: Path, monkeypatch
) -> None:
    """The comparison alone, on a run folder's record: a path typed otherwise is the same
    setting when both name one place, each from where its run was started; the same
    words are the same setting wherever they point now (a project moved or mounted
    elsewhere); where the checkpoint does not say where its run was started (an earlier
    release's, its ``--out`` absolute), other words are a change; names that are no
    path (``hf:qwen2``) compare as typed."""
    from datacentric.settings import TrainConfig
    from datacentric.train.checkpoints.checkpoint_folders import CheckpointError
    from datacentric.train.checkpoints.resume import check_unchanged

    start, other = tmp_path / "start", tmp_path / "other"
    for folder in (start, other):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "a.jsonl").write_text("{}\n")
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000001"

    def settings(dataset: str, model: str = "hf:qwen2") -> dict:
        config = TrainConfig().to_json()
        config["data"]["dataset"], config["model"]["model"] = dataset, model
        config["job"]["out"] = str(tmp_path / "run")
        return config

    saved = {"config": settings("jsonl:data/*.jsonl"), "start_dir": str(start)}
    monkeypatch.chdir(other)
    check_unchanged(checkpoint, saved, settings("jsonl:../start/data/*.jsonl"), "")
    check_unchanged(checkpoint, saved, settings("jsonl:data/*.jsonl"), "")
    with pytest.raises(CheckpointError, match=r"data\.dataset \('jsonl:data/\*\.jsonl' -> "):
        check_unchanged(checkpoint, saved, settings("jsonl:../other/data/*.jsonl"), "")
    with pytest.raises(CheckpointError, match=r"model\.model \('hf:qwen2' -> 'hf:llama'\)"):
        check_unchanged(checkpoint, saved, settings("jsonl:data/*.jsonl", "hf:llama"), "")
    unplaced = {"config": settings("jsonl:data/*.jsonl")}  # no start_dir, --out absolute
    check_unchanged(checkpoint, unplaced, settings("jsonl:data/*.jsonl"), "")
    with pytest.raises(CheckpointError, match=r"data\.dataset"):
        check_unchanged(checkpoint, unplaced, settings("jsonl:../start/data/*.jsonl"), "")
