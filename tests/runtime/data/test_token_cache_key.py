"""The token cache's key covers every file of a tokenizer folder that decides tokens.

transformers renders with ``additional_chat_templates/default.jinja`` when the folder has
one: a cache built before it was added must not be reused (it would train on the old
rendering). Every other file transformers reads (or may read) changes the key too; model
weights do not, and a FIFO among the folder's files is refused without blocking."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")

from chat_data import CHAT_TEMPLATE, conversations, save_chat_tokenizer, write_records  # noqa: E402

from datacentric.data import DataConfig, open_dataset  # noqa: E402
from datacentric.data.base import DataError  # noqa: E402
from datacentric.data.tokenizer_files import tokenizer_digest  # noqa: E402

#: The assistant's turns marked twice over: a rendering with other loss tokens.
LOUD_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% generation %}{{ m['content'] + '<|im_end|>' }}",
    "{% generation %}{{ m['content'] + ' ' + m['content'] + '<|im_end|>' }}",
)


def _rendered_loss_tokens(folder, records) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    total = 0
    for record in records:
        out = tok.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        total += sum(out["assistant_masks"][1:])
    return total


def test_an_added_chat_template_file_makes_a_new_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATACENTRIC_CACHE", str(tmp_path / "cache"))
    folder = save_chat_tokenizer(tmp_path / "tok")
    records = [{"messages": turns} for turns in conversations(6)]
    path = write_records(tmp_path / "chat.jsonl", records)
    settings = DataConfig(tokenizer=str(folder))
    before = open_dataset(f"jsonl:{path}", settings).summary()
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "default.jinja").write_text(LOUD_TEMPLATE)
    after = open_dataset(f"jsonl:{path}", settings).summary()
    assert after["cache"] != before["cache"]
    assert after["loss_tokens"] == _rendered_loss_tokens(folder, records)
    assert after["loss_tokens"] > before["loss_tokens"]  # the new rendering, not the old


@pytest.mark.parametrize(
    "name",
    [
        "additional_chat_templates/tool_use.jinja",
        "chat_template.jinja",
        "chat_template.json",
        "added_tokens.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "config.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "preprocessor_config.json",
    ],
)
def test_each_kind_of_tokenizer_file_changes_the_key(tmp_path, name) -> None:
    folder = save_chat_tokenizer(tmp_path / "tok")
    digest = tokenizer_digest(folder)
    target = folder / name
    target.parent.mkdir(exist_ok=True)
    existed = target.exists()
    with open(target, "a", encoding="utf-8") as handle:
        handle.write("\n" if existed else "{}")
    assert tokenizer_digest(folder) != digest, name


def test_weights_do_not_change_the_key_and_a_fifo_is_refused(tmp_path) -> None:
    folder = save_chat_tokenizer(tmp_path / "tok")
    digest = tokenizer_digest(folder)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "checkpoint").mkdir()
    assert tokenizer_digest(folder) == digest
    os.mkfifo(folder / "additional_chat_templates.fifo")
    with pytest.raises(DataError, match=r"additional_chat_templates\.fifo is a FIFO"):
        tokenizer_digest(folder)  # at once: nothing waits for a writer
