"""Conversations as the template sees them: tool calls, tool results, reasoning and
record-level keywords reach the chat template, and the loss tokens are the template's
own assistant mask.

The expected counts come from the user's own folder as transformers loads it
(``AutoTokenizer.from_pretrained(folder)`` then ``apply_chat_template(messages,
tools=..., return_assistant_tokens_mask=True, **keywords)``), never from an object of
ours."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from chat_data import (  # noqa: E402
    GENERATION_SPELLINGS,
    run_json,
    save_chat_tokenizer,
    tiny_qwen2_config,
    tool_conversations,
    tool_template,
    write_records,
)

from datacentric.data import DataConfig, open_dataset  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))


def _transformers_render(folder, record):
    """``(ids, assistant mask)`` of a record, as transformers renders it from the folder."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    keywords = dict(record.get("chat_template_kwargs", {}))
    keywords.update({k: record[k] for k in ("persona",) if k in record})
    out = tok.apply_chat_template(
        record["messages"],
        tools=record.get("tools"),
        return_dict=True,
        return_assistant_tokens_mask=True,
        **keywords,
    )
    return out["input_ids"], out["assistant_masks"]


def test_tool_calls_and_record_keywords_reach_the_template(tmp_path) -> None:
    folder = save_chat_tokenizer(tmp_path / "tok", tool_template())
    records = tool_conversations(10)
    path = write_records(tmp_path / "tools.jsonl", records)
    rendered = [_transformers_render(folder, r) for r in records]
    assistant = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    every = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder), loss_on="all"))
    assert assistant.summary()["loss_tokens"] == sum(sum(mask) for _, mask in rendered)
    assert every.summary()["loss_tokens"] == sum(len(ids) - 1 for ids, _ in rendered)
    for sample_id, (ids, mask) in enumerate(rendered):
        assert assistant.sample(sample_id).tolist() == ids
        assert assistant.loss_tokens(sample_id) == sum(mask[1:])
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(folder).decode(assistant.sample(0).tolist())
    assert '<tool_call>get_weather {"q"' in text and "tool get_weather c0" in text
    assert "be brief" in text and "think" not in text  # persona, enable_thinking=False
    assert "think the user asks" in AutoTokenizer.from_pretrained(folder).decode(
        assistant.sample(2).tolist()
    )


@pytest.mark.parametrize("spelling", GENERATION_SPELLINGS, ids=lambda s: s[0])
def test_every_spelling_of_the_generation_markers_trains(tmp_path, spelling) -> None:
    folder = save_chat_tokenizer(tmp_path / "tok", tool_template(spelling))
    records = tool_conversations(6)
    path = write_records(tmp_path / "tools.jsonl", records)
    ds = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    marked = sum(sum(mask) for _, mask in (_transformers_render(folder, r) for r in records))
    assert marked > 0 and ds.summary()["loss_tokens"] == marked


def test_markers_only_in_a_string_are_not_markers_and_settings_are_refused(tmp_path) -> None:
    quoted = tool_template(("{{ '{% generation %}' }}", "{{ '{% endgeneration %}' }}"))
    folder = save_chat_tokenizer(tmp_path / "quoted", quoted)
    path = write_records(tmp_path / "tools.jsonl", tool_conversations(4))
    with pytest.raises(DataError, match=r"no \{% generation %\} markers.*--loss-on all"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    marked = save_chat_tokenizer(tmp_path / "tok", tool_template())
    bad = tool_conversations(2)
    bad[1]["chat_template_kwargs"] = {"add_generation_prompt": True}
    path = write_records(tmp_path / "bad.jsonl", bad)
    with pytest.raises(DataError, match=r"bad.jsonl:2: 'add_generation_prompt' is a setting"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(marked)))


def test_train_on_tool_calls_counts_the_template_mask(tmp_path) -> None:
    """``train --json`` on a Qwen2 folder whose template renders tool calls and is
    written ``{%- generation -%}``: its ``loss_tokens`` is the template's assistant mask."""
    from transformers import Qwen2ForCausalLM

    folder = tmp_path / "qwen"
    Qwen2ForCausalLM(tiny_qwen2_config(320)).save_pretrained(folder)
    save_chat_tokenizer(folder, tool_template(GENERATION_SPELLINGS[1]))
    records = tool_conversations(8)
    path = write_records(tmp_path / "tools.jsonl", records)
    argv = ["train", "--model", f"hf:{folder}", "--tokenizer", str(folder), "--json"]
    argv += ["--dataset", f"jsonl:{path}", "--iterations", "1", "--world", "1"]
    argv += ["--global-batch-tokens", "100000", "--out", str(tmp_path / "run")]
    argv += ["--no-plots", "--no-tensorboard"]
    summary = run_json(argv, tmp_path / "cache")
    marked = sum(sum(mask) for _, mask in (_transformers_render(folder, r) for r in records))
    assert summary["samples_seen"] == len(records) and summary["loss_tokens"] == marked


def test_parquet_tool_calls_render_as_jsonl(tmp_path) -> None:
    """A table gives every record every key of its column (``None`` where it has none);
    rendered without them, a Parquet file renders as the same JSONL records do."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = save_chat_tokenizer(tmp_path / "tok", tool_template())
    records = tool_conversations(8)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "tools.parquet")
    assert pq.read_table(tmp_path / "tools.parquet").to_pylist()[1]["persona"] is None
    path = write_records(tmp_path / "tools.jsonl", records)
    jsonl = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    table = open_dataset(f"parquet:{tmp_path / 'tools.parquet'}", DataConfig(tokenizer=str(folder)))
    assert table.summary()["loss_tokens"] == jsonl.summary()["loss_tokens"]
    assert all(table.sample(i).tolist() == jsonl.sample(i).tolist() for i in range(len(jsonl)))
