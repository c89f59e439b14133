"""A validation prompts file is read bounded: a FIFO is refused without waiting on it, a
runaway line is refused before anything is tokenized, and prompts are split at ``\\n``
only (a U+2028 stays inside its prompt; a BOM and CRLF are accepted)."""

from __future__ import annotations

import os

import pytest

from datacentric.data.base import DataError
from datacentric.data.prompts import MAX_PROMPT_CHARS, Prompt, read_prompts


def test_lines_end_at_newline_only(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes('\ufeffa cat\u2028runs\r\n\r\n{"prompt": "b\\u2029c"}\r\nd\x85e'.encode())
    assert read_prompts(path) == [
        Prompt(0, "a cat\u2028runs"),
        Prompt(1, "b\u2029c"),
        Prompt(2, "d\x85e"),
    ]


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
