"""Validation prompts: a text file of one prompt per line, or JSON lines with per-prompt
settings (``{"prompt": "...", "max_new_tokens": 16, "temperature": 0.7}``; for a
pipeline's renders ``height``, ``width``, ``num_frames``, ``negative_prompt`` and
``seed``, as fine-tuners write them: ``{"prompt": "...", "height": 480, "width": 832,
"num_frames": 33, "negative_prompt": "blurry", "seed": 42}``). A setting a line leaves
out is the ``[validation]`` section's.

Read before ranks start (:func:`read_prompts`): a file that is not a regular UTF-8 text
file (a FIFO is refused, never waited on), holds no prompt, a line over
:data:`MAX_PROMPT_CHARS` characters, or a JSON line without ``prompt`` is one
:class:`~datacentric.data.base.DataError` naming the file and line. Lines end at ``\\n``,
``\\r\\n`` or a lone ``\\r`` only: a U+2028 inside a prompt stays in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datacentric.data.base import DataError
from datacentric.data.text_file import numbered_lines, parse_json_line, read_text_file

#: The longest line a prompts file may hold (a prompt, or its JSON line): a prompt is
#: tokenized and generated from on every rank, so a runaway line is refused up front.
MAX_PROMPT_CHARS = 65_536
#: A JSON line's settings of a pipeline's render (``[validation] pipeline``)
RENDER_KEYS = ("height", "width", "num_frames", "negative_prompt", "seed")


@dataclass(frozen=True)
class Prompt:
    """One validation prompt: its number in the file (from 0), its text and the
    generation settings it overrides (``None``: the ``[validation]`` section's)."""

    index: int
    text: str
    max_new_tokens: int | None = None
    temperature: float | None = None
    height: int | None = None
    """Rendered height in pixels (a pipeline's renders)."""
    width: int | None = None
    """Rendered width in pixels."""
    num_frames: int | None = None
    """Rendered frames of a video pipeline."""
    negative_prompt: str | None = None
    """What classifier-free guidance steers the render away from."""
    seed: int | None = None
    """The render's own seed (unset: the run's seed and the prompt's index; see
    :func:`~datacentric.data.diffusion_draws.render_generator`)."""


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of ``path`` (blank lines skipped; see the module doc)."""
    where = f"validation.prompts {path}"
    want = "one prompt per line, or JSON lines with a prompt each"
    text = read_text_file(path, where, want)
    prompts = []
    for number, line in numbered_lines(text):
        if line.strip():
            prompts.append(_prompt(line, len(prompts), f"{where} line {number}"))
    if not prompts:
        raise DataError(f"{where}: holds no prompt")
    return prompts


def _prompt(line: str, index: int, where: str) -> Prompt:
    if len(line) > MAX_PROMPT_CHARS:
        raise DataError(
            f"{where}: a prompt of {len(line):,} characters, over the {MAX_PROMPT_CHARS:,} a "
            "validation prompt may hold; shorten it"
        )
    stripped = line.strip()
    if not stripped.startswith("{"):
        return Prompt(index, line)
    hint = 'a line starting with { is read as JSON: write such a prompt as {"prompt": "{cat}"}'
    record = parse_json_line(stripped, where, hint=hint)
    if not isinstance(record.get("prompt"), str):
        raise DataError(f'{where}: a JSON line needs a "prompt" string')
    unknown = sorted(set(record) - {"prompt", "max_new_tokens", "temperature", *RENDER_KEYS})
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(unknown)}")
    render = {key: record.get(key) for key in RENDER_KEYS}
    for key, least in (("height", 1), ("width", 1), ("num_frames", 1), ("seed", 0)):
        value = render[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise DataError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
        if value is not None and value < least:
            raise DataError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
    negative = render["negative_prompt"]
    if negative is not None and not isinstance(negative, str):
        raise DataError(f"{where}: negative_prompt must be a string, got {negative!r}")
    steps, heat = record.get("max_new_tokens"), record.get("temperature")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise DataError(f"{where}: max_new_tokens must be an integer >= 1, got {steps!r}")
    if heat is not None and (not isinstance(heat, int | float) or heat < 0):
        raise DataError(f"{where}: temperature must be a number >= 0, got {heat!r}")
    heat = None if heat is None else float(heat)
    return Prompt(index, record["prompt"], steps, heat, **render)


def check_prompt_tokens(
    prompts: list[Prompt],
    encode: Callable[[list[str]], list[list[int]]],
    max_new_tokens: int,
    limit: int,
    where: str,
) -> None:
    """Refuse a prompt whose tokens (``encode``: the run's tokenizer) and the tokens
    generated after it (its ``max_new_tokens``, else ``max_new_tokens``) are over
    ``limit``, the longest sequence the run may continue (before ranks start)."""
    for prompt, ids in zip(prompts, encode([p.text for p in prompts]), strict=True):
        new = prompt.max_new_tokens or max_new_tokens
        if len(ids) + new > limit:
            raise DataError(
                f"{where}: prompt {prompt.index} is {len(ids):,} tokens, {len(ids) + new:,} "
                f"with its {new} new tokens, over the {limit:,} the run may continue (the "
                "[data] max_tokens and the model's positions); shorten it"
            )
