"""Conversations as training samples: records rendered with a model's chat template, the
loss on the assistant's tokens.

- Records: ``messages`` (a list of messages, each with a ``role``), or ``prompt`` and
  ``completion`` (strings: one user turn and one assistant turn; or lists of messages:
  the prompt's turns then the completion's), in JSONL, Parquet or a saved ``datasets``
  folder. A file holds text records or conversations, as its first record says.
- What the template sees is what ``apply_chat_template`` would: every key of every
  message (``content``, ``tool_calls``, ``name``, ``tool_call_id``,
  ``reasoning_content``, ...), the record's ``tools`` and ``documents``, the entries of
  its ``chat_template_kwargs`` (TRL's column), and any other field of the record that
  the template reads (below: *What a template reads*).
- Rendering: the tokenizer of ``--tokenizer DIR`` (a folder saved with
  ``save_pretrained``, usually the model's own), read with ``local_files_only=True`` and
  ``trust_remote_code=False``; its chat template renders each conversation and marks the
  assistant's tokens (``apply_chat_template(..., return_assistant_tokens_mask=True)``).
- Loss (``[data] loss_on``): ``assistant`` (the default for conversations) trains only on
  the tokens the template marks; ``all`` on every token. ``assistant`` needs a template
  that marks them (a ``generation`` block, as transformers parses it) and is refused in
  one line otherwise: we do not guess turns from rendered text. A token carries loss when
  the token it predicts is marked, so a sample's loss tokens are its marked tokens after
  the first (the first is predicted by nothing).

What a template reads, found the way transformers reads it: the template is parsed by
transformers' own Jinja environment (the one ``apply_chat_template`` renders with, its
``{% generation %}`` extension included), never matched as a string.

- Markers: a template marks the assistant's tokens when its parsed tree holds a block
  of transformers' ``generation`` tag, however it is written (``{% generation %}``,
  ``{%- generation -%}``, ``{%generation%}``).
- Variables: the names the template reads that it does not set itself
  (``jinja2.meta.find_undeclared_variables``), so a record's own keywords (``tools``,
  ``documents``, ``enable_thinking``, ...) reach it when it reads them.
- Which template: a folder with several named templates renders a record that has
  ``tools`` with its ``tool_use`` template when it has one, else with ``default``
  (transformers' ``get_chat_template``).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.documents import LOSS_ON as LOSS_ON  # read beside the records now
from datacentric.data.documents import Record, require
from datacentric.data.documents import is_conversation as is_conversation  # its old home

#: Text every usable tokenizer encodes to at least one token.
PROBE_TEXT = "hello world"
#: The fields that hold the conversation itself.
CONVERSATION_FIELDS = ("messages", "prompt", "completion")
#: Record fields that ``apply_chat_template`` takes by name, whether or not the template
#: reads them (``tools`` also chooses a ``tool_use`` template).
NAMED_KEYWORDS = ("tools", "documents")
#: ``apply_chat_template``'s own settings: a record may not set them.
RENDER_SETTINGS = (
    "conversation",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "sanitize_control_tokens",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def conversation_turns(record: Record) -> list[dict]:
    """The turns of a conversation record, each a message with every key it has, checked
    to be a mapping with a string ``role``."""
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
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str)):
            raise DataError(
                f"{record.where}: turn {number} is not a message (a mapping with a string 'role')"
            )
    return [dict(turn) for turn in turns]


def without_nones(value: object) -> object:
    """``value`` with every mapping entry whose value is ``None`` left out, at any depth:
    a table (Parquet, ``datasets``) gives each record every key of its column, ``None``
    where the record has none (an assistant turn without ``tool_calls`` would have
    ``tool_calls: None``, which a template testing ``'tool_calls' in message`` reads as
    a tool call), as TRL removes them."""
    if isinstance(value, dict):
        return {k: without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nones(v) for v in value]
    return value


def _table_fields(fields: dict) -> dict:
    """A table's record as the same JSONL record reads (:func:`without_nones`), its null
    conversation cells kept when it has no conversation without them, so that they are
    named as a JSONL ``null`` is (not as a missing ``prompt`` and ``completion``)."""
    kept = without_nones(fields)
    if not is_conversation(kept):
        kept |= {k: None for k in CONVERSATION_FIELDS if k in fields and fields[k] is None}
    return kept


def template_keywords(record: Record, variables: frozenset[str]) -> dict[str, object]:
    """The keywords a record passes to ``apply_chat_template``: its ``tools`` and
    ``documents``, the entries of its ``chat_template_kwargs``, and every other field the
    template reads (``variables``); one that names an ``apply_chat_template`` setting
    (``add_generation_prompt``, ``tokenize``, ...) is refused."""
    fields = record.fields
    given = fields.get("chat_template_kwargs") or {}
    if not isinstance(given, dict):
        raise DataError(f"{record.where}: chat_template_kwargs must be a mapping of keywords")
    keywords = dict(given)
    for key, value in fields.items():
        if key in CONVERSATION_FIELDS or key == "chat_template_kwargs":
            continue
        if key in NAMED_KEYWORDS or key in variables:
            if key in given:
                raise DataError(
                    f"{record.where}: {key!r} is given twice (a field and in "
                    "chat_template_kwargs); keep one"
                )
            keywords[key] = value
    for key in keywords:
        if key in RENDER_SETTINGS:
            raise DataError(
                f"{record.where}: {key!r} is a setting of apply_chat_template, not a template "
                "variable; training renders whole conversations, so remove it from the record"
            )
    return keywords


#: The method transformers' generation extension calls for each ``{% generation %}`` block.
GENERATION_CALL = "_generation_support"


@dataclasses.dataclass(frozen=True)
class TemplateFacts:
    """What one chat template source reads and marks."""

    marks_assistant: bool
    variables: frozenset[str]


def template_source(tokenizer, folder: str, tools: object = None) -> str:
    """The template ``apply_chat_template`` renders a record with (``tools``: the record's)."""
    try:
        return tokenizer.get_chat_template(None, tools)
    except ValueError as err:  # several named templates and no default
        raise DataError(f"--tokenizer {folder}: {str(err).splitlines()[0]}") from None


def template_facts(source: str, folder: str) -> TemplateFacts:
    """Markers and variables of a template source, parsed by transformers' environment."""
    try:
        return _parse(source)
    except Exception as err:  # jinja raises TemplateSyntaxError and its subtypes
        raise DataError(
            f"--tokenizer {folder}: its chat template does not parse ({type(err).__name__}: "
            f"{err}); fix the template"
        ) from None


@lru_cache(maxsize=16)
def _parse(source: str) -> TemplateFacts:
    jinja2 = require("jinja2", extra="hf")
    meta = require("jinja2.meta", extra="hf")
    chat_utils = require("transformers.utils.chat_template_utils", extra="hf")
    environment = chat_utils._compile_jinja_template(source).environment
    tree = environment.parse(source)
    marks = any(
        isinstance(block.call, jinja2.nodes.Call)
        and isinstance(block.call.node, jinja2.nodes.ExtensionAttribute)
        and block.call.node.name == GENERATION_CALL
        for block in tree.find_all(jinja2.nodes.CallBlock)
    )
    return TemplateFacts(marks, frozenset(meta.find_undeclared_variables(tree)))


def load_tokenizer(folder: str):
    """The tokenizer saved in ``folder``, read from local files without running its code."""
    transformers = require("transformers", extra="hf")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # transformers raises several types for an unusable folder
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"--tokenizer {folder}: not a tokenizer folder saved with save_pretrained ({first})"
        ) from None
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str | dict):  # a BOM an editor saved the template with
        tokenizer.chat_template = (
            template.removeprefix("\ufeff")
            if isinstance(template, str)
            else {
                k: v.removeprefix("\ufeff") if isinstance(v, str) else v
                for k, v in template.items()
            }
        )
    if not tokenizer(PROBE_TEXT)["input_ids"]:  # a model folder without its tokenizer files
        held = ", ".join(sorted(p.name for p in Path(folder).iterdir())[:6]) or "nothing"
        raise DataError(
            f"--tokenizer {folder}: the folder holds no tokenizer (it encodes text to no "
            f"tokens; it holds {held}); save one there with tokenizer.save_pretrained, or "
            "give the folder that has tokenizer.json"
        )
    return tokenizer


def chosen_templates(tokenizer) -> dict[str, str]:
    """The templates a conversation may be rendered with, by name: the one template, or of
    several named ones ``default`` and ``tool_use`` (for records with ``tools``)."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        return {name: template[name] for name in ("default", "tool_use") if name in template}
    return {"chat_template": template}


def chat_renderer(tokenizer, folder: str | None, chat_file: str) -> ChatRenderer:
    """The chat renderer of the tokenizer a folder holds (``tokenizer``:
    :func:`load_tokenizer`'s; ``None`` for a ``tokenizer.json`` or bytes, which have no
    template), as conversations need; ``chat_file``: the file whose first record is a
    conversation, named when there is none."""
    if tokenizer is None:
        given = f"--tokenizer {folder}" if folder else "no --tokenizer"
        raise DataError(
            f"conversations need a chat template: {chat_file} holds conversations (its "
            f"first record has messages, or prompt and completion), and {given} gives "
            "none; pass --tokenizer DIR, a folder saved with save_pretrained (usually "
            "the model's), or leave that file out of the dataset"
        )
    return ChatRenderer(tokenizer, folder)


class ChatRenderer:
    """Renders conversations to token ids and the assistant-token mask."""

    def __init__(self, tokenizer, folder: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"the tokenizer of {folder} (--tokenizer, else the hf: model folder's own) "
                "has no chat template, so conversations cannot be rendered; pass "
                "--tokenizer DIR of a tokenizer with one (an instruct model's), or save this "
                "one with its chat_template"
            )
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(
                f"the tokenizer of {folder} (--tokenizer, else the hf: model folder's own) "
                "is a slow one, which cannot mark assistant tokens; save a fast one "
                "(tokenizer.json) there, or pass --tokenizer DIR of one"
            )
        self.tokenizer, self.folder = tokenizer, folder
        self.unmarked = [
            name
            for name, source in chosen_templates(tokenizer).items()
            if not template_facts(source, folder).marks_assistant
        ]
        self.marks_assistant = not self.unmarked

    def check_loss_on(self, loss_on: str) -> None:
        """Refuse ``assistant`` loss with a template that does not mark the turns."""
        if loss_on == "assistant" and not self.marks_assistant:
            which = (
                "its chat template"
                if self.unmarked == ["chat_template"]
                else (f"its {' and '.join(self.unmarked)} chat template")
            )
            raise DataError(
                f"--tokenizer {self.folder}: {which} has no {{% generation %}} "
                "markers, so the assistant's tokens are unknown; pass --loss-on all, or "
                "add the markers around the assistant's content in the template"
            )

    def render(self, record: Record, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """``(token ids, assistant mask as uint8)`` of one conversation record, rendered
        as ``apply_chat_template`` renders it with the record's own keywords (a table's
        record without the ``None`` its columns gave it: :func:`without_nones`)."""
        if record.columnar:
            record = dataclasses.replace(record, fields=_table_fields(record.fields))
        turns = conversation_turns(record)
        source = template_source(self.tokenizer, self.folder, record.fields.get("tools"))
        facts = template_facts(source, self.folder)
        keywords = template_keywords(record, facts.variables)
        try:
            out = self.tokenizer.apply_chat_template(
                turns,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=facts.marks_assistant,
                tokenizer_kwargs={"verbose": False},  # a long one is chunked, not refused
                **keywords,
            )
        except Exception as err:  # the template's own errors (jinja raises its types)
            raise DataError(f"{record.where}: the chat template failed ({err})") from None
        ids = np.asarray(out["input_ids"], dtype=dtype)
        if facts.marks_assistant:
            mask = np.asarray(out["assistant_masks"], dtype=np.uint8)
        else:
            mask = np.zeros(len(ids), dtype=np.uint8)
        return ids, mask
