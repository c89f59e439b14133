"""An ``hf:DIR`` model reads text with its own tokenizer unless ``--tokenizer`` names
another: the loss tokens of a run are ``AutoTokenizer.from_pretrained(DIR)``'s count on
the same records, a folder without a tokenizer is refused before ranks start, and
``--tokenizer bytes`` is the one way to UTF-8 byte ids."""

from __future__ import annotations

import json

import pytest
from chat_data import (
    WORDS,
    save_chat_tokenizer,
    save_tiny_qwen2,
    tiny_qwen2_config,
    write_records,
)
from cli_here import cli_here, cli_json_here

from datacentric.data.base import DataError
from datacentric.data.sources import model_tokenizer, open_dataset
from datacentric.settings.sections import DataConfig

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))


RUN = ["--cost-model", "analytic", "--no-progress", "--no-plots"]
RUN += ["--no-tensorboard", "--json"]


def _model_folder(folder):
    """A tiny Qwen2 (random weights, an embedding of 320 rows) and its own tokenizer."""
    from transformers import AutoModelForCausalLM

    save_chat_tokenizer(folder)
    AutoModelForCausalLM.from_config(tiny_qwen2_config(320)).save_pretrained(folder)
    return folder


def _texts(count: int) -> list[str]:
    words = WORDS.split()
    return [" ".join(words[(i * 3) % len(words) :] + words[: i % 5]) for i in range(count)]


def test_an_hf_model_trains_on_its_own_tokenizer_by_default(tmp_path, capsys):
    """No ``--tokenizer``: every record's loss tokens are those of the folder's own
    tokenizer (each record's ids but the last), not of its UTF-8 bytes; the summary and
    ``config.json`` name the folder."""
    from transformers import AutoTokenizer

    folder = _model_folder(tmp_path / "qwen")
    texts = _texts(12)
    data = write_records(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "run"
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}"]
    summary = cli_json_here([*argv, *RUN, "--out", str(out)], capsys)
    ids = AutoTokenizer.from_pretrained(folder)(texts)["input_ids"]
    assert summary["loss_tokens"] == sum(len(i) - 1 for i in ids)
    assert summary["loss_tokens"] != sum(len(t.encode()) - 1 for t in texts)  # not bytes
    assert summary["tokenizer"] == str(folder)
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["data"]["tokenizer"] == str(folder)


def test_a_model_folder_without_a_tokenizer_is_refused_before_ranks_start(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "bare"
    AutoModelForCausalLM.from_config(tiny_qwen2_config(300)).save_pretrained(folder)
    data = write_records(tmp_path / "docs.jsonl", [{"text": t} for t in _texts(4)])
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}", *RUN]
    capsys.readouterr()  # the save's progress bar
    status, _, err = cli_here([*argv, "--out", str(tmp_path / "run")], capsys)
    assert status == 2
    assert "the model folder holds no tokenizer; pass --tokenizer DIR" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run" / "config.json").exists()  # no rank started


def test_a_folder_whose_own_tokenizer_outgrows_its_config_names_the_folder(tmp_path, capsys):
    """A folder's own tokenizer with an added token (one id more than its config.json's
    vocab_size) is refused naming both counts and the resize, not with advice to use the
    model's own tokenizer (the one read); read by default or named with --tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = save_chat_tokenizer(tmp_path / "qwen")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab_size = len(tokenizer)
    tokenizer.add_tokens(["<tool_call>"])
    tokenizer.save_pretrained(folder)
    AutoModelForCausalLM.from_config(tiny_qwen2_config(vocab_size)).save_pretrained(folder)
    data = write_records(tmp_path / "docs.jsonl", [{"text": t} for t in _texts(4)])
    argv = ["train", "--model", f"hf:{folder}", "--dataset", f"jsonl:{data}", *RUN]
    capsys.readouterr()  # the save's progress bar
    file = folder / "tokenizer.json"
    for named, ids in (
        ([], len(AutoTokenizer.from_pretrained(folder))),
        (["--tokenizer", str(file)], Tokenizer.from_file(str(file)).get_vocab_size(True)),
    ):
        status, _, err = cli_here([*argv, *named, "--out", str(tmp_path / "run")], capsys)
        assert status == 2 and err.count("\n") == 1, err
        assert ids > vocab_size
        assert f"the folder's own tokenizer has {ids} ids (added tokens included)" in err
        assert f"config.json says vocab_size {vocab_size}" in err
        assert "model.resize_token_embeddings(len(tokenizer))" in err
        assert "use the model's own tokenizer" not in err
    assert not (tmp_path / "run" / "config.json").exists()  # no rank started


def test_bytes_are_chosen_only_by_name_or_for_our_own_models(tmp_path):
    """``--tokenizer bytes`` reads UTF-8 bytes as an unset tokenizer did; unset, only a
    model that is not an ``hf:DIR`` folder (a preset, a tiny name, a factory) gets them."""
    folder = _model_folder(tmp_path / "qwen")
    assert model_tokenizer(f"hf:{folder}", None) == str(folder)
    assert model_tokenizer(f"hf:{folder}", "bytes") == "bytes"
    for own in ("llama", "hf:qwen2", "tests.user_models:tiny_gpt"):
        assert model_tokenizer(own, None) is None
    with pytest.raises(DataError, match="holds no tokenizer"):
        model_tokenizer(f"hf:{tmp_path}", None)
    data = write_records(tmp_path / "docs.jsonl", [{"text": t} for t in _texts(3)])
    named = open_dataset(f"jsonl:{data}", DataConfig(tokenizer="bytes"))
    assert named.vocab_size == 256
    assert [named.loss_tokens(i) for i in range(3)] == [len(t.encode()) - 1 for t in _texts(3)]


def test_the_planning_commands_count_the_tokens_train_reads(tmp_path, capsys):
    """``schedule`` of an ``hf:DIR`` model without ``--tokenizer`` counts each record's
    tokens with the folder's own tokenizer, as ``train`` does (not its UTF-8 bytes); a
    folder without a tokenizer is refused as ``train`` refuses it. The model of
    :func:`save_tiny_qwen2` covers every id of its folder's tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    folder = save_tiny_qwen2(tmp_path / "qwen")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert AutoConfig.from_pretrained(folder).vocab_size >= len(tokenizer)
    texts = _texts(12)
    data = write_records(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    argv = ["schedule", "--dataset", f"jsonl:{data}", "--hardware", "cpu-local"]
    argv += ["--world", "1", "--memory-gb", "8", "--json"]
    saved = tmp_path / "schedule.json"
    capsys.readouterr()  # the save's progress bar
    summary = cli_json_here([*argv, "--model", f"hf:{folder}", "--json-out", str(saved)], capsys)
    assert summary["samples_total"] == len(texts)
    schedule = json.loads(saved.read_text())
    batches = [
        batch
        for step in schedule["iterations"]
        for group in step["assignments"]
        for batch in group["micro_batches"]
    ]
    assert sorted(i for b in batches for i in b["samples"]) == list(range(len(texts)))
    counted = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
    assert sum(b["tokens"] for b in batches) == counted
    assert counted != sum(len(t.encode()) for t in texts)  # not bytes
    bare = tmp_path / "bare"
    AutoConfig.from_pretrained(folder).save_pretrained(bare)
    status, _, err = cli_here([*argv, "--model", f"hf:{bare}"], capsys)
    assert status == 2
    assert "the model folder holds no tokenizer; pass --tokenizer DIR" in err
    assert err.count("\n") == 1 and "Traceback" not in err
