"""JSONL that cannot be read is refused naming its file and line: a line that is not
UTF-8, nested deeper than the reader's stack, holding an integer too long to convert, or
naming a key twice (json.loads kept the last value); an empty file names the file, with
or without a ``--tokenizer`` folder (a tokenizer failed on the empty batch with ``list
index out of range``)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from chat_data import save_chat_tokenizer  # noqa: E402

from datacentric.cli.main import main  # noqa: E402
from datacentric.data import DataConfig, open_dataset  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402

GOOD = b'{"text": "hello world"}\n'
BAD_LINES = [
    (b"\xff\xfe\x00 garbage\n", "line is not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    (b'{"text": "b", "n": ' + b"9" * 5000 + b"}\n", "cannot be read (Exceeds the limit"),
    (b"9" * 5000 + b"\n", "cannot be read"),
    (b'{"text": "a \\ud83d b"}\n', "holds .ud83d, half of a UTF-16 surrogate pair"),
    (b'{"text": "a", "text": "b"}\n', "line names the key 'text' twice"),
    (b'{"messages": [{"role": "user", "role": "assistant"}]}\n', "names the key 'role' twice"),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return str(save_chat_tokenizer(tmp_path_factory.mktemp("tok") / "tok"))


@pytest.mark.parametrize("with_tokenizer", [False, True])
@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_a_bad_line_is_named(tmp_path, monkeypatch, tokenizer, with_tokenizer, line, says):
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD + line + GOOD)
    settings = DataConfig(tokenizer=tokenizer if with_tokenizer else None)
    with pytest.raises(DataError, match=f"^{path}:2: .*{says.replace('(', '.')}"):
        open_dataset(f"jsonl:{path}", settings)


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_an_empty_file_is_named(tmp_path, monkeypatch, capsys, tokenizer, with_tokenizer):
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    extra = ["--tokenizer", tokenizer] if with_tokenizer else []
    argv = ["train", "--dataset", f"jsonl:{path}", *extra, "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [f"datacentric train: jsonl:{path}: holds no document (its files are empty)"]
