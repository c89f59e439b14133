"""A ``datasets.Dataset`` in TRL's formats as pre-tokenized records (``input_ids`` and
``labels``, -100 on the tokens without loss), written as JSONL in the run folder and
read by the data layer's pre-tokenized records (:mod:`datacentric.data.tokenized`).

The formats and their loss, as TRL's ``SFTTrainer`` prepares them:

- text (``dataset_text_field``): the text with the tokenizer's EOS appended when it
  does not end with it; loss on every token;
- conversational (``messages``): the chat template's tokens; with
  ``assistant_only_loss`` the loss only on the tokens the template marks
  ``{% generation %}`` (the tokenizer's assistant mask);
- prompt-completion (``prompt``, ``completion``, strings or messages): the tokens of
  prompt + completion (EOS appended to a string completion), the completion starting
  where they differ from the prompt's own tokens (a conversational prompt rendered with
  the generation prompt); with ``completion_only_loss`` (unset: on) the loss only on
  the completion;
- pre-tokenized (``input_ids``, with optional ``labels``, ``completion_mask``,
  ``assistant_masks``): kept as given, the masks honoured.

Each record is cut to ``max_length`` tokens (its start kept); a record left with no
loss token is left out, as TRL does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

IGNORE = -100
MASKS = ("completion_mask", "assistant_masks")


class RecordsError(ValueError):
    """A dataset record the drop-in cannot read, named."""


def tokenized_records(
    rows: Iterable[dict[str, Any]],
    tokenizer: Any,
    *,
    text_field: str = "text",
    assistant_only_loss: bool = False,
    completion_only_loss: bool | None = None,
    max_length: int | None = None,
    add_eos: bool = True,
    chat_template: str | None = None,
    drop_unlabelled: bool = True,
) -> list[dict[str, list[int]]]:
    """Every row as ``{"input_ids", "labels"}`` (rows with no loss token left out, as
    TRL's truncation leaves them out; ``drop_unlabelled=False``: a :class:`RecordsError`
    naming the first, where TRL keeps it as a row of its batches); ``chat_template``: the
    template conversations are rendered with (unset: the tokenizer's)."""
    out = []
    for index, row in enumerate(rows):
        ids, keep = _tokens(
            row, tokenizer, text_field, assistant_only_loss, add_eos, index, chat_template
        )
        if completion_only_loss is False:
            keep.pop("completion_mask", None)
        labels = [
            token if all(mask[i] for mask in keep.values()) else IGNORE
            for i, token in enumerate(ids)
        ]
        if max_length is not None:
            ids, labels = ids[:max_length], labels[:max_length]
        if any(label != IGNORE for label in labels):
            out.append({"input_ids": [int(t) for t in ids], "labels": [int(t) for t in labels]})
        elif not drop_unlabelled:
            raise RecordsError(
                f"record {index}: no token to train on (every label -100), which TRL keeps as "
                "a row of its batches (without max_length, with packing or "
                "skip_prepare_dataset) and the drop-in cannot; leave such rows out "
                "(dataset.filter)"
            )
    if not out:
        raise RecordsError("no record of the dataset has a token to train on")
    return out


def is_trl_collator(collator: Any) -> bool:
    """``collator`` is TRL's ``DataCollatorForLanguageModeling``: it pads the rows and
    takes their labels as given (else the ids), with or without ``padding_free``; the
    loss it leads to is the packed records' (transformers' class of the same name
    rewrites the labels instead)."""
    kind = type(collator)
    return kind.__name__ == "DataCollatorForLanguageModeling" and kind.__module__.startswith("trl.")


def _tokens(
    row: dict[str, Any],
    tokenizer: Any,
    text_field: str,
    assistant_only: bool,
    add_eos: bool,
    index: int,
    chat_template: str | None = None,
) -> tuple[list[int], dict[str, list[int]]]:
    """``(input_ids, {mask name: mask})`` of one row in any of the formats."""
    if row.get("input_ids") is not None:
        ids = list(row["input_ids"])
        masks = {name: list(row[name]) for name in (*MASKS, "labels") if row.get(name) is not None}
        if "labels" in masks:
            labels = masks.pop("labels")
            masks["labels"] = [int(label != IGNORE) for label in labels]
        return ids, masks
    eos = tokenizer.eos_token or ""
    template = {"tools": _tools(row), **(row.get("chat_template_kwargs") or {})}
    if chat_template is not None:
        template["chat_template"] = chat_template
    if "prompt" in row and "completion" in row:
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, list):
            prompt_ids = _chat(tokenizer, prompt, add_generation_prompt=True, **template)
            full = _chat(
                tokenizer,
                prompt + completion,
                return_assistant_tokens_mask=assistant_only,
                **template,
            )
        else:
            if add_eos and not completion.endswith(eos):
                completion += eos
            prompt_ids = {"input_ids": tokenizer(text=prompt)["input_ids"]}
            full = {"input_ids": tokenizer(text=prompt + completion)["input_ids"]}
        ids = list(full["input_ids"])
        start = _common_prefix(list(prompt_ids["input_ids"]), ids)
        masks = {"completion_mask": [0] * start + [1] * (len(ids) - start)}
        if "assistant_masks" in full:
            masks["assistant_masks"] = list(full["assistant_masks"])
        return ids, masks
    if "messages" in row:
        full = _chat(
            tokenizer, row["messages"], return_assistant_tokens_mask=assistant_only, **template
        )
        masks = {"assistant_masks": list(full["assistant_masks"])} if assistant_only else {}
        if assistant_only and 1 not in masks["assistant_masks"]:
            raise RecordsError(
                f"record {index}: assistant_only_loss, but the chat template marks no "
                "assistant token ({% generation %} missing from the template?)"
            )
        return list(full["input_ids"]), masks
    if text_field not in row:
        raise RecordsError(
            f"record {index}: no {text_field!r}, messages, prompt and completion, or "
            f"input_ids (its columns: {', '.join(sorted(row))}); set dataset_text_field"
        )
    text = row[text_field]
    if add_eos and not text.endswith(eos):
        text += eos
    return list(tokenizer(text=text)["input_ids"]), {}


def _chat(tokenizer: Any, messages: list, **keywords: Any) -> dict[str, Any]:
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **keywords)


def _tools(row: dict[str, Any]) -> Any:
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Leading tokens ``a`` and ``b`` share (the completion starts after them)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def write_records(records: list[dict[str, list[int]]], path: Path) -> None:
    """``records`` as JSONL at ``path`` (written whole, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
