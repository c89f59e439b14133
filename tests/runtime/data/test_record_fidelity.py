"""What a user's JSONL and Parquet files hold reaches training as written, each case
checked against an independent reading (Python's ``json``, ``pyarrow`` directly): a
source whose first file holds no record reads what the next file holds."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from chat_data import save_chat_tokenizer, write_records  # noqa: E402

from datacentric.data import DataConfig, documents, open_dataset  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402

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


def _texts(ds) -> list[str]:
    return [bytes(ds.sample(i).tolist()).decode("utf-8") for i in range(len(ds))]


def test_a_binary_parquet_column_of_utf8_is_read_as_its_text(tmp_path, tokenizer):
    """Impala, Hive and older Spark write strings as binary columns (no UTF-8 annotation):
    each row was refused as 'field 'text' is a bytes, not a string'."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    written = ["caf\u00e9 \U0001f431", "", "line\r\nend\u2028"]
    for binary in (pa.binary(), pa.large_binary()):
        path = tmp_path / f"{binary}.parquet"
        pq.write_table(pa.table({"text": pa.array([t.encode() for t in written], binary)}), path)
        ds = open_dataset(f"parquet:{path}")
        expected = [b.decode("utf-8") for b in pq.read_table(path)["text"].to_pylist()]
        assert _texts(ds) == [t for t in expected if t]
        assert ds.summary()["skipped_empty"] == 1
    path = tmp_path / "latin1.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", b"caf\xe9!"], pa.binary())}), path)
    with pytest.raises(
        DataError, match=rf"^{path} row 1: field 'text' is binary and not UTF-8 .*byte 3"
    ):
        open_dataset(f"parquet:{path}")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("null", "is null"),
        ("5", "is a number"),
        ("true", "is true/false"),
        ('["a"]', "is an array"),
    ],
)
def test_a_text_field_of_another_json_kind_is_named_as_json_names_it(
    tmp_path, tokenizer, value, says
):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a"}\n{"text": ' + value + "}\n")
    with pytest.raises(DataError, match=rf"^{path}:2: field 'text' {says}, not a string"):
        open_dataset(f"jsonl:{path}")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('[{"text": "a"}, {"text": "b"}]', "an array"),
        ('"a"', "a string"),
        # the first record, read for the records' kind: a TypeError ('argument of type
        # 'int' is not iterable'), or a line naming input_ids taken for token records
        ("5", "a number"),
        ("null", "null"),
        ("true", "true/false"),
        ('"input_ids"', "a string"),
        ('["input_ids"]', "an array"),
    ],
)
def test_a_line_that_is_no_object_is_named_as_no_record(tmp_path, tokenizer, line, says):
    """A ``.json`` file of one JSON array (which a folder's search takes as JSONL) said
    'no string field 'text' (found: list); pass --text-field NAME'; a first line of a
    number, null or true/false stopped with a traceback."""
    path = tmp_path / "data.json"
    path.write_text(line + "\n")
    with pytest.raises(DataError, match=rf"^{path}:1: {says}, not an object; JSONL holds one"):
        open_dataset(f"jsonl:{tmp_path}")


def test_a_null_parquet_cell_is_named_not_trained(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["a", None]}), path)
    with pytest.raises(DataError, match=rf"^{path} row 1: field 'text' is null, not a string"):
        open_dataset(f"parquet:{path}")


@pytest.mark.parametrize("codec", ["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32"])
def test_jsonl_lines_read_as_json_reads_them_in_utf8_utf16_and_utf32(tmp_path, tokenizer, codec):
    """Windows PowerShell's ``>`` writes UTF-16 with its byte-order mark, as text files,
    lists and captions are read: each such JSONL file was refused at line 1 as not
    UTF-8. In every encoding lines split at LF only (U+2028, U+2029 and U+0085 inside a
    string stay), a blank or white line is no record, the last may lack its LF, and a
    line of a mebibyte reads whole."""
    lines = ['{"text": "caf\u00e9 \U0001f431"}', "", '{"text": "a\u2028b\\r\\nc"}\r', " \t"]
    lines.append(json.dumps({"text": "\u2029\x85" + "x" * 2**20}, ensure_ascii=False))
    lines.append('{"text": "last, no line end"}')
    mark = "\ufeff" if codec.endswith("-be") else ""
    path = tmp_path / "data.jsonl"
    path.write_bytes((mark + "\n".join(lines)).encode(codec))
    ds = open_dataset(f"jsonl:{path}", DataConfig(max_tokens=2**21))  # each one sample
    expected = [json.loads(line)["text"] for line in lines if line.strip()]
    assert _texts(ds) == expected
    assert [ds.sample_source(i) for i in range(len(ds))] == [f"{path}:{n}" for n in (1, 3, 5, 6)]
    path.write_bytes((mark + '{"text": "a"}\n{"text": 5}\n').encode(codec))
    with pytest.raises(DataError, match=rf"^{path}:2: field 'text' is a number"):
        open_dataset(f"jsonl:{path}")
    if codec.startswith("utf-8"):
        return
    path.write_bytes((mark + '{"text": "a"}\n{"text": "b"}\n').encode(codec)[:-1])
    with pytest.raises(DataError, match=rf"^{path}:2: line is not {codec[:6].upper()} text"):
        open_dataset(f"jsonl:{path}")


def test_a_null_conversation_cell_is_named_as_the_jsonl_null_is(tmp_path, tokenizer):
    """A table's record has its ``None`` entries left out before rendering; a null
    ``messages`` cell was left out too, and the record refused as 'prompt and completion
    must both be strings or both lists of messages' in a table that has neither."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    records = [{"messages": CONVERSATION}, {"messages": None}]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "chat.parquet")
    write_records(tmp_path / "chat.jsonl", records)
    for name, where in (("chat.parquet", " row 1"), ("chat.jsonl", ":2")):
        path = tmp_path / name
        with pytest.raises(DataError, match=rf"^{path}{where}: messages must be a non-empty list"):
            open_dataset(f"{name.split('.')[1]}:{path}", DataConfig(tokenizer=tokenizer))


#: A template that renders content given as a list of parts (OpenAI's and HF's
#: multimodal chat data) as Qwen2-VL's does: a part with an ``image`` key is a picture.
PARTS_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}"
    "{{ m['content'] | map(attribute='text') | join('') + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{% for part in m['content'] %}"
    "{% if 'image' in part %}{{ '<image>' }}{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{{ '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
)


def test_content_as_a_list_of_parts_renders_as_apply_chat_template_renders_it(tmp_path, tokenizer):
    """Parquet gives each text part the ``image: null`` its column has; it is left out,
    so the table's record renders as the JSONL one and as transformers renders the turns
    (kept, every text part would render as a picture)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from transformers import AutoTokenizer

    folder = str(save_chat_tokenizer(tmp_path / "parts", PARTS_TEMPLATE))
    user = [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "hello world"}]
    turns = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}]
    turns += [
        {"role": "user", "content": user},
        {"role": "assistant", "content": [{"type": "text", "text": "how are you"}]},
    ]
    write_records(tmp_path / "c.jsonl", [{"messages": turns}])
    pq.write_table(pa.Table.from_pylist([{"messages": turns}]), tmp_path / "c.parquet")
    reference = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    for spec in (f"jsonl:{tmp_path / 'c.jsonl'}", f"parquet:{tmp_path / 'c.parquet'}"):
        ds = open_dataset(spec, DataConfig(tokenizer=folder))
        assert ds.sample(0).tolist() == list(reference["input_ids"]), spec
        marked = ds.target_mask(0).tolist()[:-1]
        assert marked == [bool(m) for m in reference["assistant_masks"][1:]], spec


def test_documents_longer_than_the_tokenizer_s_model_length_are_read_without_its_warning(
    tmp_path, tokenizer, capfd, caplog
):
    """transformers warned 'Token indices sequence length is longer than the specified
    maximum sequence length for this model (60 > 8). Running this sequence through the
    model will result in indexing errors' while the dataset was read, of documents and
    conversations that --max-tokens then chunks (or --long-docs says what to do), where
    its warnings are let through (the Python API, ``--verbose``)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    try:
        _read_long_documents(tmp_path, tokenizer)
    finally:
        hf_logging.set_verbosity(level)
    said = capfd.readouterr().err + caplog.text
    assert "Token indices sequence length" not in said


def _read_long_documents(tmp_path, tokenizer) -> None:
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    config["model_max_length"] = 8
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    long = "hello world " * 20
    write_records(tmp_path / "text.jsonl", [{"text": long}])
    turns = [{"role": "user", "content": long}, {"role": "assistant", "content": "how are"}]
    write_records(tmp_path / "chat.jsonl", [{"messages": turns}])
    for name in ("text.jsonl", "chat.jsonl"):
        ds = open_dataset(
            f"jsonl:{tmp_path / name}", DataConfig(tokenizer=tokenizer, max_tokens=16)
        )
        assert ds.summary()["total_tokens"] > 8


@pytest.mark.parametrize("form", ["numpy", "torch", "pandas", "arrow"])
def test_a_dataset_saved_with_a_format_reads_as_its_rows(tmp_path, tokenizer, form):
    """``set_format("torch")`` before ``save_to_disk`` (as tokenizing scripts do) is
    saved with the dataset: its rows came as arrays, tensors or tables, and token ids
    failed as 'The truth value of an array with more than one element is ambiguous',
    every record under pandas and arrow as a TypeError or AttributeError."""
    datasets = pytest.importorskip("datasets")
    rows = {"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [4, 5]]}
    datasets.Dataset.from_dict(rows).with_format(form).save_to_disk(tmp_path / "ids")
    texts = ["caf\u00e9", "line\r\nend"]
    datasets.Dataset.from_dict({"text": texts}).with_format(form).save_to_disk(tmp_path / "t")
    ds = open_dataset(f"hf-datasets:{tmp_path / 'ids'}")
    assert [ds.sample(i).tolist() for i in range(len(ds))] == rows["input_ids"]
    assert [ds.loss_tokens(i) for i in range(len(ds))] == [2, 1]
    assert _texts(open_dataset(f"hf-datasets:{tmp_path / 't'}")) == texts


def test_parquet_rows_of_every_row_group_and_file_come_once_in_order(tmp_path, monkeypatch):
    """Row groups of 2, read in batches of 3, over two files and a dictionary-encoded and
    a large_string column: every row once, in pyarrow's order, named by its own row."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("datacentric.data.documents.PARQUET_BATCH_ROWS", 3)
    (tmp_path / "data").mkdir()
    first = pa.array([f"a{i}" for i in range(7)]).dictionary_encode()
    pq.write_table(pa.table({"text": first}), tmp_path / "data" / "a.parquet", row_group_size=2)
    second = pa.array(["b0", "b1 \u00e9"], pa.large_string())
    pq.write_table(pa.table({"text": second}), tmp_path / "data" / "b.parquet")
    ds = open_dataset(f"parquet:{tmp_path / 'data'}")
    files = sorted((tmp_path / "data").iterdir())
    expected = [t for f in files for t in pq.read_table(f)["text"].to_pylist()]
    assert _texts(ds) == expected
    rows = [f"{f} row {r}" for f in files for r in range(pq.ParquetFile(f).metadata.num_rows)]
    assert [ds.sample_source(i) for i in range(len(ds))] == rows


@pytest.mark.parametrize(
    ("columns", "name"),
    [({"text": ["first"]}, "text"), ({"input_ids": [[1, 2]]}, "input_ids")],
)
def test_a_parquet_column_named_twice_is_refused_as_a_repeated_json_key_is(
    tmp_path, tokenizer, columns, name
):
    """pyarrow writes a table with two columns of one name; a row read as a mapping kept
    the second's value and dropped the first's, silently (a JSONL key named twice is
    refused)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ((key, values),) = columns.items()
    table = pa.table([pa.array(values), pa.array(values), pa.array([1])], names=[key, key, "id"])
    pq.write_table(table, tmp_path / "p.parquet")
    path = tmp_path / "p.parquet"
    with pytest.raises(DataError, match=rf"^{path}: names the column '{name}' twice"):
        open_dataset(f"parquet:{path}")


def test_a_file_that_is_not_utf8_is_named_with_its_byte_and_the_fix(tmp_path, tokenizer):
    """A Latin-1 file (``é`` as byte 0xE9): the byte is named, and how to read it."""
    (tmp_path / "doc.txt").write_bytes("caf\u00e9!".encode("latin-1"))
    with pytest.raises(
        DataError,
        match=r"doc\.txt: not UTF-8 text \(invalid continuation byte at byte 3\); save it as "
        r"UTF-8 \(or UTF-16 with its byte-order mark\)$",
    ):
        open_dataset(f"text:{tmp_path / 'doc.txt'}")
    (tmp_path / "data.jsonl").write_bytes(
        '{"text": "a"}\n{"text": "caf\u00e9"}\n'.encode("latin-1")
    )
    with pytest.raises(
        DataError,
        match=r"data\.jsonl:2: line is not UTF-8 text \(invalid continuation byte at byte 13 of "
        r"the line\); save the file as UTF-8 \(or UTF-16 with its byte-order mark\)$",
    ):
        open_dataset(f"jsonl:{tmp_path / 'data.jsonl'}")


def test_sharegpt_records_are_named_with_the_fix_not_a_text_field(tmp_path, tokenizer):
    """ShareGPT's ``conversations`` of ``from``/``value`` turns read as text records
    without the text field, whose fix said 'pass --text-field NAME' (which then read
    'field 'conversations' is an array')."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    turns = [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "world"}]
    write_records(tmp_path / "share.jsonl", [{"conversations": turns}])
    pq.write_table(pa.Table.from_pylist([{"conversations": turns}]), tmp_path / "share.parquet")
    for spec in ("jsonl:share.jsonl", "parquet:share.parquet"):
        kind, name = spec.split(":")
        with pytest.raises(DataError, match=r"ShareGPT's conversations .* write them as messages"):
            open_dataset(f"{kind}:{tmp_path / name}", DataConfig(tokenizer=tokenizer))


@pytest.mark.parametrize("opening", ["[", "{", " [ "])
def test_a_json_file_spread_over_lines_is_named_with_the_fix(tmp_path, tokenizer, opening):
    """A pretty-printed ``.json`` file said 'line is not JSON (Expecting value)' at its
    first line, and nothing of what JSONL is."""
    path = tmp_path / "data.json"
    rest = '\n  {"text": "a"}\n]\n' if "[" in opening else '\n  "text": "a"\n}\n'
    path.write_text(opening + rest)
    with pytest.raises(DataError, match=rf"^{path}:1: line is not JSON .*; JSONL holds one"):
        open_dataset(f"jsonl:{path}")


def test_a_conversation_table_is_read_once_to_find_its_first_record(
    tmp_path, tokenizer, monkeypatch
):
    """The first record (a Parquet file's first batch of rows, every column) was read
    twice, for the records' kind and for the file whose template folder renders them: a
    cached dataset of long conversations took a third longer to open."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist([{"messages": CONVERSATION}] * 3), tmp_path / "c.parquet")
    spec, settings = f"parquet:{tmp_path / 'c.parquet'}", DataConfig(tokenizer=tokenizer)
    built = open_dataset(spec, settings)
    reads = []
    parquet = documents._READERS["parquet"]
    monkeypatch.setitem(documents._READERS, "parquet", lambda *a: reads.append(a) or parquet(*a))
    again = open_dataset(spec, settings)
    assert len(reads) == 1 and again.summary() == built.summary()
