"""Conversations as training samples: records rendered with a model's chat template, the
loss on the assistant's tokens.

- Records: ``messages`` (a list of ``{"role", "content"}``), or ``prompt`` and
  ``completion`` (strings: one user turn and one assistant turn; or lists of messages:
  the prompt's turns then the completion's), in JSONL, Parquet or a saved ``datasets``
  folder. A file holds text records or conversations, as its first record says.
- Rendering: the tokenizer of ``--tokenizer DIR`` (a folder saved with
  ``save_pretrained``, usually the model's own), read with ``local_files_only=True`` and
  ``trust_remote_code=False``; its chat template renders each conversation and marks the
  assistant's tokens (``apply_chat_template(..., return_assistant_tokens_mask=True)``).
- Loss (``[data] loss_on``): ``assistant`` (the default for conversations) trains only on
  the tokens the template marks; ``all`` on every token. ``assistant`` needs a template
  that marks them (``{% generation %}`` ... ``{% endgeneration %}``) and is refused in one
  line otherwise: we do not guess turns from rendered text. A token carries loss when the
  token it predicts is marked, so a sample's loss tokens are its marked tokens after the
  first (the first is predicted by nothing).
"""

from __future__ import annotations

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.documents import Record, require

LOSS_ON = ("assistant", "all")


def is_conversation(fields: object) -> bool:
    """Whether a record is a conversation (``messages``, or ``prompt`` and ``completion``)."""
    return isinstance(fields, dict) and (
        "messages" in fields or ("prompt" in fields and "completion" in fields)
    )


def conversation_turns(record: Record) -> list[dict[str, str]]:
    """The turns of a conversation record, checked (each a role and a string content)."""
    fields = record.fields
    if "messages" in fields:
        turns = fields["messages"]
    elif isinstance(fields.get("prompt"), str) and isinstance(fields.get("completion"), str):
        turns = [
            {"role": "user", "content": fields["prompt"]},
            {"role": "assistant", "content": fields["completion"]},
        ]
    else:
        prompt, completion = fields.get("prompt"), fields.get("completion")
        if not isinstance(prompt, list) or not isinstance(completion, list):
            raise DataError(
                f"{record.where}: prompt and completion must both be strings or both lists "
                "of messages"
            )
        turns = [*prompt, *completion]
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{record.where}: messages must be a non-empty list of turns")
    for number, turn in enumerate(turns):
        if not (
            isinstance(turn, dict)
            and isinstance(turn.get("role"), str)
            and isinstance(turn.get("content"), str)
        ):
            raise DataError(f"{record.where}: turn {number} is not {{'role': str, 'content': str}}")
    return [{"role": t["role"], "content": t["content"]} for t in turns]


def load_tokenizer(folder: str):
    """The tokenizer saved in ``folder``, read from local files without running its code."""
    transformers = require("transformers", extra="hf")
    try:
        return transformers.AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # transformers raises several types for an unusable folder
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"--tokenizer {folder}: not a tokenizer folder saved with save_pretrained ({first})"
        ) from None


def marks_assistant(tokenizer) -> bool:
    """Whether the tokenizer's chat template marks the assistant's tokens."""
    template = getattr(tokenizer, "chat_template", None)
    templates = template.values() if isinstance(template, dict) else [template]
    return any(
        isinstance(t, str) and "{% generation %}" in t.replace("{%-", "{%") for t in templates
    )


class ChatRenderer:
    """Renders conversations to token ids and the assistant-token mask."""

    def __init__(self, tokenizer, folder: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"--tokenizer {folder}: has no chat template, so conversations cannot be "
                "rendered; save the model's tokenizer with its chat_template"
            )
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(
                f"--tokenizer {folder}: a slow tokenizer cannot mark assistant tokens; save "
                "a fast one (tokenizer.json)"
            )
        self.tokenizer, self.folder = tokenizer, folder
        self.marks_assistant = marks_assistant(tokenizer)

    def check_loss_on(self, loss_on: str) -> None:
        """Refuse ``assistant`` loss with a template that does not mark the turns."""
        if loss_on == "assistant" and not self.marks_assistant:
            raise DataError(
                f"--tokenizer {self.folder}: its chat template has no {{% generation %}} "
                "markers, so the assistant's tokens are unknown; pass --loss-on all, or "
                "add the markers around the assistant's content in the template"
            )

    def render(self, record: Record, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """``(token ids, assistant mask as uint8)`` of one conversation record."""
        turns = conversation_turns(record)
        try:
            out = self.tokenizer.apply_chat_template(
                turns,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=self.marks_assistant,
            )
        except Exception as err:  # the template's own errors (jinja raises its types)
            raise DataError(f"{record.where}: the chat template failed ({err})") from None
        ids = np.asarray(out["input_ids"], dtype=dtype)
        if self.marks_assistant:
            mask = np.asarray(out["assistant_masks"], dtype=np.uint8)
        else:
            mask = np.zeros(len(ids), dtype=np.uint8)
        return ids, mask
