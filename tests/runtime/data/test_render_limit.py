"""Rendering a conversation runs under a time limit: a chat template that loops (the
sandbox stops it reaching files, not looping) is stopped and the record refused naming
its file and line, instead of holding ``train`` until killed."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("transformers")

from chat_data import CHAT_TEMPLATE, conversations, save_chat_tokenizer, write_records  # noqa: E402

from datacentric.data import (  # noqa: E402
    DataConfig,
    open_dataset,
    render_limit,  # noqa: E402
)
from datacentric.data.base import DataError  # noqa: E402
from datacentric.data.render_limit import RenderDeadline, RenderTimeout  # noqa: E402

#: 10**10 empty iterations (the sandbox caps one range at 10**5, not two nested ones),
#: only for a conversation whose first turn says "loop".
LOOPING = (
    "{% if messages[0]['content'] == 'loop' %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + CHAT_TEMPLATE
)


def test_a_looping_template_is_stopped_naming_file_and_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(render_limit, "RENDER_LIMIT_S", 1.0)
    folder = save_chat_tokenizer(tmp_path / "tok", template=LOOPING)
    records = [{"messages": turns} for turns in conversations(4)]
    records.insert(
        2, {"messages": [{"role": "user", "content": "loop"}, *records[0]["messages"][1:]]}
    )
    path = write_records(tmp_path / "chat.jsonl", records)
    start = time.monotonic()
    with pytest.raises(DataError, match=f"{path}:3: rendering .* stopped after 1 s"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    assert time.monotonic() - start < 30
    assert render_limit.RENDER_LIMIT_S < 60 and RenderDeadline().limit_s == 1.0
    del records[2]  # without the looping record the same template renders
    path = write_records(tmp_path / "chat.jsonl", records)
    assert len(open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))) == 4


def test_the_deadline_fires_only_inside_a_render() -> None:
    with RenderDeadline(0.2) as deadline:
        with deadline.each():
            pass
        time.sleep(0.8)  # disarmed: nothing is raised later
        with pytest.raises(RenderTimeout):
            with deadline.each():
                while True:
                    pass
        with deadline.each():
            total = sum(range(1000))
    assert total == 499500


def test_a_rendering_over_the_size_limit_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(render_limit, "RENDER_MAX_TOKENS", 40)
    folder = save_chat_tokenizer(tmp_path / "tok")
    turns = conversations(2)
    turns[1] = [{"role": "user", "content": "hello " * 50}, *turns[1][1:]]
    path = write_records(tmp_path / "chat.jsonl", [{"messages": t} for t in turns])
    with pytest.raises(DataError, match=f"{path}:2: .* to \\d+ tokens, over the limit of 40"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))


def test_a_large_valid_record_gets_a_limit_grown_with_its_size(tmp_path, monkeypatch) -> None:
    """1 MiB of assistant text renders only because the limit grows with the record's
    size: it takes 0.1-0.2 s of the 1 s its dataset takes to open here (idle; 0.5-1.5 s
    on a loaded 2-core machine), over a 0.02 s base limit that a small record renders
    well within; without the growth, a limit of a fortieth of the time the open took
    stops it (the open's time, measured in the same run, scales with the machine's load
    as the render does)."""
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(render_limit, "RENDER_LIMIT_S", 0.02)
    folder = save_chat_tokenizer(tmp_path / "tok", template=LOOPING)
    content = "hello world " * ((1 << 20) // 12)
    big = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    path = write_records(
        tmp_path / "chat.jsonl", [{"messages": conversations(1)[0]}, {"messages": big}]
    )
    start = time.monotonic()
    dataset = open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
    took = time.monotonic() - start
    assert len(dataset) > 2  # the long record is in it (cut to the context)
    assert render_limit.render_limit_s(10.0, 10 * 10**6) > 90  # 10 MB: 10 + 95 s
    # unscaled (the old, fixed limit), a limit well under its render time stops it
    monkeypatch.setattr(render_limit, "RENDER_S_PER_MIB", 0.0)
    monkeypatch.setattr(render_limit, "RENDER_LIMIT_S", took / 40)  # it renders in 10-20%
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache2"))
    alone = write_records(tmp_path / "big.jsonl", [{"messages": big}])
    with pytest.raises(DataError, match=f"{alone}:1: rendering .* stopped after"):
        open_dataset(f"jsonl:{alone}", DataConfig(tokenizer=str(folder)))


def test_a_record_over_the_character_limit_is_refused_as_too_long(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(render_limit, "RENDER_MAX_CHARS", 1000)
    folder = save_chat_tokenizer(tmp_path / "tok")
    turns = conversations(2)
    turns[1] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 1500}]
    path = write_records(tmp_path / "chat.jsonl", [{"messages": t} for t in turns])
    with pytest.raises(DataError, match=f"{path}:2: .* holds 15\\d\\d characters .* limit of 1000"):
        open_dataset(f"jsonl:{path}", DataConfig(tokenizer=str(folder)))
