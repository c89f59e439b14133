"""Validation prompts: a text file of one prompt per line, or JSON lines with per-prompt
settings (``{"prompt": "...", "max_new_tokens": 16, "temperature": 0.7}``).

Read before ranks start (:func:`read_prompts`): a file that is not UTF-8 text, holds no
prompt, or a JSON line without ``prompt`` is one :class:`~datacentric.data.base.DataError`
naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from datacentric.data.base import DataError


@dataclass(frozen=True)
class Prompt:
    """One validation prompt: its number in the file (from 0), its text and the
    generation settings it overrides (``None``: the ``[validation]`` section's)."""

    index: int
    text: str
    max_new_tokens: int | None = None
    temperature: float | None = None


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of ``path`` (blank lines skipped; see the module doc)."""
    where = f"validation.prompts {path}"
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"{where}: cannot read it ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{where}: not a text file (byte {err.start} is not UTF-8); give one prompt per "
            "line, or JSON lines with a prompt each"
        ) from None
    if "\x00" in text:
        raise DataError(f"{where}: not a text file (it holds NUL bytes)")
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            prompts.append(_prompt(line, len(prompts), f"{where} line {number}"))
    if not prompts:
        raise DataError(f"{where}: holds no prompt")
    return prompts


def _prompt(line: str, index: int, where: str) -> Prompt:
    stripped = line.strip()
    if not stripped.startswith("{"):
        return Prompt(index, line)
    try:
        record = json.loads(stripped)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(record.get("prompt"), str):
        raise DataError(f'{where}: a JSON line needs a "prompt" string')
    unknown = sorted(set(record) - {"prompt", "max_new_tokens", "temperature"})
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(unknown)}")
    steps, heat = record.get("max_new_tokens"), record.get("temperature")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise DataError(f"{where}: max_new_tokens must be an integer >= 1, got {steps!r}")
    if heat is not None and (not isinstance(heat, int | float) or heat < 0):
        raise DataError(f"{where}: temperature must be a number >= 0, got {heat!r}")
    return Prompt(index, record["prompt"], steps, None if heat is None else float(heat))
