"""What a user's JSONL and Parquet files hold reaches training as written, each case
checked against an independent reading (Python's ``json``, ``pyarrow`` directly): a
source whose first file holds no record reads what the next file holds."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from chat_data import save_chat_tokenizer, write_records  # noqa: E402

from datacentric.data import DataConfig, open_dataset  # noqa: E402

CONVERSATION = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]


@pytest.fixture
def tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    return str(save_chat_tokenizer(tmp_path / "tok"))


@pytest.mark.parametrize("empty", [b"", b"\n \n"])
@pytest.mark.parametrize(
    ("record", "records"),
    [({"messages": CONVERSATION}, "chat"), ({"input_ids": [1, 2, 3]}, "tokens")],
)
def test_a_first_file_without_records_leaves_the_kind_to_the_next(
    tmp_path, tokenizer, empty, record, records
):
    """An empty JSONL file sorted first (a shard with nothing left, ``a.jsonl`` beside
    ``b.jsonl``) made a folder of conversations or of token ids read as text records:
    every record then failed as 'a conversation, though the first record of the dataset
    is text' or 'no string field 'text''."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(empty)
    write_records(tmp_path / "data" / "b.jsonl", [record, record])
    ds = open_dataset(f"jsonl:{tmp_path / 'data'}", DataConfig(tokenizer=tokenizer))
    assert ds.summary()["records"] == records
    assert [ds.sample_source(i) for i in range(len(ds))] == [
        f"{tmp_path / 'data' / 'b.jsonl'}:{n}" for n in (1, 2)
    ]
    if records == "tokens":
        assert ds.sample(0).tolist() == json.loads(json.dumps(record))["input_ids"]


def test_a_parquet_file_of_no_rows_first_leaves_the_kind_to_the_next(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "data").mkdir()
    table = pa.Table.from_pylist([{"messages": CONVERSATION}])
    pq.write_table(table.slice(0, 0), tmp_path / "data" / "a.parquet")
    pq.write_table(table, tmp_path / "data" / "b.parquet")
    ds = open_dataset(f"parquet:{tmp_path / 'data'}", DataConfig(tokenizer=tokenizer))
    assert ds.summary()["records"] == "chat"
    assert ds.sample_source(0) == f"{tmp_path / 'data' / 'b.parquet'} row 0"
