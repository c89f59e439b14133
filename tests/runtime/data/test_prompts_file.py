"""A validation prompts file is read bounded: a FIFO is refused without waiting on it, a
runaway line is refused before anything is tokenized, and prompts are split at ``\\n``
only (a U+2028 stays inside its prompt; a BOM and CRLF are accepted)."""

from __future__ import annotations

import json
import os

import pytest

from datacentric.data.base import DataError
from datacentric.data.prompts import (
    MAX_PROMPT_CHARS,
    Prompt,
    check_prompt_tokens,
    read_prompts,
)


def test_lines_end_at_newline_only(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes('\ufeffa cat\u2028runs\r\n\r\n{"prompt": "b\\u2029c"}\r\nd\x85e'.encode())
    assert read_prompts(path) == [
        Prompt(0, "a cat\u2028runs"),
        Prompt(1, "b\u2029c"),
        Prompt(2, "d\x85e"),
    ]


def test_a_file_of_lone_cr_line_ends_is_a_prompt_a_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b'a cat\r{"prompt": "b dog"}\r\rsame\rsame\r')
    assert read_prompts(path) == [
        Prompt(0, "a cat"),
        Prompt(1, "b dog"),
        Prompt(2, "same"),
        Prompt(3, "same"),
    ]
    path.write_bytes(b"a\rb\r{cat} in a hat\r")
    with pytest.raises(DataError, match=r"prompts.txt line 3: not JSON .* write such a prompt as"):
        read_prompts(path)
    path.write_text('{"prompt": "{cat} in a hat"}\n')
    assert read_prompts(path) == [Prompt(0, "{cat} in a hat")]


def test_a_prompt_holding_half_a_surrogate_pair_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text('{"prompt": "a \\ud83d\\udc31 cat"}\n{"prompt": "a \\ud83d cat"}\n')
    with pytest.raises(DataError, match=r"prompts.txt line 2: holds .ud83d, half of a UTF-16"):
        read_prompts(path)
    path.write_text('{"prompt": "a \\ud83d\\udc31 cat"}\n')
    assert read_prompts(path) == [Prompt(0, "a \U0001f431 cat")]


def test_a_fifo_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "prompts.txt")
    with pytest.raises(DataError, match=r"prompts.txt: cannot read it .*a FIFO"):
        read_prompts(tmp_path / "prompts.txt")


def test_a_runaway_prompt_is_refused_by_its_length(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("short one\n" + "x" * 2_000_000 + "\n")
    with pytest.raises(DataError, match=r"line 2: a prompt of 2,000,000 characters, over"):
        read_prompts(path)
    path.write_text("y" * MAX_PROMPT_CHARS + "\n")
    assert len(read_prompts(path)[0].text) == MAX_PROMPT_CHARS


def test_a_prompt_and_its_new_tokens_fit_the_run(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text('a b c\n{"prompt": "a b c d", "max_new_tokens": 2}\n')
    prompts = read_prompts(path)

    def words(texts):
        return [t.split() for t in texts]

    check_prompt_tokens(prompts, words, 3, 6, "here")  # 3 + 3 and 4 + 2 tokens
    with pytest.raises(DataError, match=r"here: prompt 0 is 3 tokens, 7 with its 4 new tokens"):
        check_prompt_tokens(prompts, words, 4, 6, "here")


def _train_refuses(tmp_path, capsys, *flags: str) -> str:
    from run_config import SMALL_TRAIN_FLAGS

    from datacentric.cli.main import main

    out = tmp_path / "run"
    assert main(["train", *SMALL_TRAIN_FLAGS, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("datacentric train: "), err
    assert not out.exists() or not (out / "metrics.jsonl").exists()
    return err


def test_train_refuses_a_fifo_or_runaway_prompts_before_ranks_start(tmp_path, capsys):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    err = _train_refuses(tmp_path, capsys, "--validation.prompts", str(fifo))
    assert f"validation.prompts {fifo}: cannot read it" in err and "FIFO" in err
    huge = tmp_path / "huge.txt"
    huge.write_text("x" * 2_000_000 + "\n")
    err = _train_refuses(tmp_path, capsys, "--validation.prompts", str(huge))
    assert "line 1: a prompt of 2,000,000 characters" in err


def test_train_refuses_a_prompt_longer_than_the_run_continues(tmp_path, capsys):
    pytest.importorskip("transformers")
    from runtime.models.test_model_source import _pretrained_folder

    folder = tmp_path / "qwen"
    texts = _pretrained_folder(folder)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:8]))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("word1 " * 200 + "\n")
    capsys.readouterr()  # save_pretrained's progress
    err = _train_refuses(
        tmp_path,
        capsys,
        *("--model", f"hf:{folder}", "--dataset", f"jsonl:{data}"),
        *("--tokenizer", str(folder / "tokenizer.json"), "--max-tokens", "128"),
        *("--validation.prompts", str(prompts), "--validation.max_new_tokens", "8"),
    )
    assert f"validation.prompts {prompts}: prompt 0 is 200 tokens, 208 with its 8" in err
