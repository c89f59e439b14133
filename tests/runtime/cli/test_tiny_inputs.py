"""``datacentric tiny --out DIR`` writes inputs the commands read as a user's own: a model
folder whose tokenizer and chat template load with it, Wan and Flux pipeline folders of
the tiny transformers, clips listed with captions, text and chat JSONL; run again, it
keeps what is there. (tests/test_doc_tiny_inputs.py runs the docs' commands on them.)"""

from __future__ import annotations

import csv
import json

import pytest

from datacentric.cli.main import main


def test_tiny_writes_a_model_pipelines_clips_and_jsonl(tmp_path, capfd) -> None:
    pytest.importorskip("diffusers")
    pytest.importorskip("av")
    from transformers import AutoConfig, AutoTokenizer

    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    out = tmp_path / "tiny"
    assert main(["tiny", "--out", str(out)]) == 0
    said = capfd.readouterr().out.splitlines()
    assert said[0].startswith("datacentric tiny: writing a model folder")
    assert all(said)  # no blank lines (the tokenizer trainers' progress)
    assert len([line for line in said if line.startswith("wrote ")]) == 9, said

    tokenizer = AutoTokenizer.from_pretrained(out / "my-model", local_files_only=True)
    assert len(tokenizer) <= AutoConfig.from_pretrained(out / "my-model").vocab_size
    chats = [json.loads(line) for line in (out / "chat.jsonl").read_text().splitlines()]
    rendered = tokenizer.apply_chat_template(
        chats[1]["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert 0 < sum(rendered["assistant_masks"]) < len(rendered["input_ids"])  # marked turns
    texts = [
        json.loads(line)["text"]
        for line in (out / "data/train.jsonl").read_text().split("\n")
        if line
    ]
    assert len(texts) == 48 and (out / "tokenizer.json").is_file()

    for family, pipeline in (("wan", "WanPipeline"), ("flux", "FluxPipeline")):
        folder = out / f"my-{family}-pipeline"
        assert json.loads((folder / "model_index.json").read_text())["_class_name"] == pipeline
        config = json.loads((folder / "transformer" / "config.json").read_text())
        tiny = TINY_DIFFUSERS[family][1]
        assert {k: config[k] for k in tiny} == {
            k: list(v) if isinstance(v, tuple) else v for k, v in tiny.items()
        }

    with open(out / "clips" / "captions.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and all((out / "clips" / r["path"]).stat().st_size for r in rows)
    assert all(r["text"] for r in rows)

    before = (out / "chat.jsonl").stat().st_mtime_ns
    assert main(["tiny", "--out", str(out)]) == 0  # kept, not written again
    assert "already there" in capfd.readouterr().out
    assert (out / "chat.jsonl").stat().st_mtime_ns == before


def test_tiny_without_diffusers_or_pyav_writes_the_rest_and_says_what_to_install(
    tmp_path, capsys, monkeypatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers: ImportError
    monkeypatch.setitem(sys.modules, "av", None)
    assert main(["tiny", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    for name in ("my-wan-pipeline", "my-flux-pipeline", "clips"):
        assert f"{tmp_path / name}: skipped, " in said and "'datacentric[video]'" in said, said
        assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.partial").exists()
    assert (tmp_path / "my-model" / "config.json").is_file() and (tmp_path / "chat.jsonl").is_file()
