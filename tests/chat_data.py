"""A tiny chat tokenizer folder and conversation files for the chat-data tests.

The tokenizer is a byte-level BPE trained here on a few words (nothing is downloaded),
saved with ``save_pretrained`` as a transformers fast tokenizer whose chat template
marks the assistant's content with ``{% generation %}`` (as Qwen2's and TRL's
training templates do): ``datacentric tiny``'s, trained on other words.
"""

from __future__ import annotations

import json
from pathlib import Path

from datacentric.cli.tiny import CHAT_TEMPLATE, bpe_tokenizer, save_chat_model
from datacentric.cli.tiny import tiny_qwen2_config as tiny_qwen2_config  # tests import it here

#: The same rendering with no markers: the assistant's tokens are unknown.
UNMARKED_TEMPLATE = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
WORDS = "hello world how are you the user asks and the assistant answers briefly"


def save_tiny_qwen2(folder: Path, seed: int = 0) -> Path:
    """:func:`save_chat_tokenizer`'s tokenizer and a :func:`tiny_qwen2_config` model of
    its vocabulary (random weights from ``seed``) saved together in ``folder`` (the
    vocabulary counted as the folder's tokenizer class reads it: ``save_chat_model``)."""
    tokenizer = bpe_tokenizer(WORDS.split(), vocab_size=320, template=CHAT_TEMPLATE)
    return save_chat_model(folder, tokenizer, seed)


def save_chat_tokenizer(folder: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A fast tokenizer with ``template`` saved in ``folder``."""
    bpe_tokenizer(WORDS.split(), vocab_size=320, template=template).save_pretrained(folder)
    return folder


def conversations(count: int) -> list[list[dict[str, str]]]:
    """``count`` conversations of varied lengths (some with a system turn, some with two
    exchanges)."""
    words = WORDS.split()
    out = []
    for i in range(count):
        turns = [{"role": "system", "content": "be brief"}] if i % 3 == 0 else []
        for exchange in range(1 + i % 2):
            ask = " ".join(words[(i + exchange + k) % len(words)] for k in range(2 + i % 5))
            answer = " ".join(words[(2 * i + k) % len(words)] for k in range(1 + (i * 7) % 9))
            turns += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        out.append(turns)
    return out


def write_records(path: Path, records: list[dict]) -> Path:
    """One JSON record per line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


#: A template that renders what tool-use templates render (Qwen2.5's layout): the
#: record's ``tools``, each assistant turn's ``reasoning_content``, ``content`` and
#: ``tool_calls``, each tool turn's ``name`` and ``tool_call_id``, and the record-level
#: ``persona`` and ``chat_template_kwargs``' ``enable_thinking``; ``OPEN`` and ``CLOSE``
#: are the generation markers, to be spelled by the caller.
TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\ntools: ' }}{% for t in tools %}"
    "{{ t.function.name }} {% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- if persona is defined %}{{ '<|im_start|>system\\n' + persona + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role }}"
    "{%- if m.role == 'tool' %}{{ ' ' + m.name + ' ' + m.tool_call_id }}{% endif %}"
    "{{ '\\n' }}{%- if m.role == 'assistant' %}OPEN"
    "{%- if m.reasoning_content and enable_thinking is not false %}"
    "{{ 'think ' + m.reasoning_content + ' ' }}{% endif %}"
    "{{ m.content or '' }}{%- for c in m.tool_calls or [] %}"
    "{{ '<tool_call>' + c.function.name + ' ' + (c.function.arguments | tojson) }}"
    "{{ '</tool_call>' }}{% endfor %}{{ '<|im_end|>' }}CLOSE"
    "{%- else %}{{ m.content + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
)
GENERATION_SPELLINGS = (
    ("{% generation %}", "{% endgeneration %}"),
    ("{%- generation -%}", "{%- endgeneration -%}"),
    ("{% generation -%}", "{% endgeneration -%}"),
    ("{%generation%}", "{%endgeneration%}"),
)


def tool_template(spelling: tuple[str, str] = GENERATION_SPELLINGS[1]) -> str:
    """:data:`TOOL_TEMPLATE` with its generation markers spelled ``spelling``."""
    return TOOL_TEMPLATE.replace("OPEN", spelling[0]).replace("CLOSE", spelling[1])


def tool_conversations(count: int) -> list[dict]:
    """``count`` records with tool calls (the transformers / OpenAI message format,
    ``content: ""``), tool results, reasoning and record-level keywords, of varied
    lengths; every other one is a plain conversation."""
    words = WORDS.split()
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("get_weather", "search")
    ]
    out = []
    for i in range(count):
        ask = " ".join(words[(i + k) % len(words)] for k in range(2 + i % 4))
        answer = " ".join(words[(3 * i + k) % len(words)] for k in range(1 + i % 6))
        if i % 2:
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": ask},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
            continue
        call = {"name": tools[i % 4 // 2]["function"]["name"], "arguments": {"q": ask}}
        record = {
            "tools": tools,
            "messages": [
                {"role": "user", "content": ask},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "the user asks",
                    "tool_calls": [{"type": "function", "id": f"c{i}", "function": call}],
                },
                {"role": "tool", "name": call["name"], "tool_call_id": f"c{i}", "content": answer},
                {"role": "assistant", "content": answer},
            ],
        }
        if i % 4 == 0:
            record["persona"] = "be brief"
            record["chat_template_kwargs"] = {"enable_thinking": False}
        out.append(record)
    return out


def run_json(argv: list[str], cache: Path) -> dict:
    """``datacentric ARGV`` in this process (its ranks are spawned from it), with the token
    cache under ``cache``: its last stdout line read as JSON, after checking it exited 0.
    A child interpreter would import torch and transformers again, most of a one-step
    run's time."""
    import contextlib
    import io
    import os

    from datacentric.cli.main import main

    previous = os.environ.get("DATACENTRIC_CACHE")
    os.environ["DATACENTRIC_CACHE"] = str(cache)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            try:
                status = main(argv)
            except SystemExit as done:
                status = done.code
    finally:
        if previous is None:
            del os.environ["DATACENTRIC_CACHE"]
        else:
            os.environ["DATACENTRIC_CACHE"] = previous
    assert status == 0, out.getvalue()[-3000:]
    return json.loads(out.getvalue().strip().splitlines()[-1])
