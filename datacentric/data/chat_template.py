"""What a chat template reads, found the way transformers reads it: the template is
parsed by transformers' own Jinja environment (the one ``apply_chat_template`` renders
with, its ``{% generation %}`` extension included), never matched as a string.

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

from dataclasses import dataclass
from functools import lru_cache

from datacentric.data.base import DataError
from datacentric.data.documents import require

#: The method transformers' generation extension calls for each ``{% generation %}`` block.
GENERATION_CALL = "_generation_support"


@dataclass(frozen=True)
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
