"""docs/configuration.md's table of sections names every key of each section, and the
defaults it states are the schema's (no torch)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from datacentric.settings import SECTIONS, SchedulingConfig
from datacentric.settings.command_defaults import COMMAND_DEFAULTS
from datacentric.settings.sections import DataConfig, ValidationConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def _section_rows() -> dict[str, str]:
    """``section -> its row's text`` of the table of sections."""
    rows = re.findall(r"^\| `\[(\w+)\]` \| (.*) \|$", DOC.read_text(encoding="utf-8"), re.M)
    return dict(rows)


def test_the_table_of_sections_names_every_key():
    """A row ending its list with ``...`` names the keys it explains; every other row all."""
    rows = _section_rows()
    assert set(rows) == set(SECTIONS)
    for section, row in rows.items():
        if "..." in row:
            continue
        named = set(re.findall(r"`(\w+)`", row))
        fields = [f.name for f in dataclasses.fields(SECTIONS[section])]
        assert [f for f in fields if f not in named] == [], section


def test_the_defaults_the_doc_states_are_the_schemas():
    text = DOC.read_text(encoding="utf-8")
    assert "`max_tokens` (default 4096" in text and DataConfig().max_tokens == 4096
    assert "`max_micro_batch_size` (default 4096" in text
    assert SchedulingConfig().max_micro_batch_size == 4096
    assert "| `max_new_tokens` | tokens generated per prompt (32) |" in text
    assert ValidationConfig().max_new_tokens == 32
    assert "| `fps` | frame rate of the rendered videos (16) |" in text
    assert ValidationConfig().fps == 16
    assert "| `temperature` | 0 (default)" in text and ValidationConfig().temperature == 0


#: Command defaults of keys the command offers no flag for (set inside it, not shown).
NOT_FLAGS = {("bench", "tokens_per_iteration"), ("bench", "progress")}


def test_the_commands_own_defaults_the_doc_lists_are_command_defaults():
    """Every value of ``COMMAND_DEFAULTS`` that a flag shows is in the paragraph listing
    them, beside its command's name."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("A flag's default is the schema's")
    paragraph = " ".join(text[start : text.index("\n\n", start)].split())
    for command, overrides in COMMAND_DEFAULTS.items():
        for key, override in overrides.items():
            if override.value is None or (command, key) in NOT_FLAGS:
                continue
            value = f"{override.value:g}" if isinstance(override.value, float) else override.value
            assert f"`{command}" in paragraph and str(value) in paragraph, (command, key)


def test_the_doc_says_bench_s_and_demo_s_world_under_torchrun():
    """``bench``'s and ``demo``'s world is chosen when they run (``Override.shown``:
    ``2; under torchrun, its WORLD_SIZE``), and the paragraph of command defaults says
    both halves, not ``--world 2`` alone."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("A flag's default is the schema's")
    paragraph = " ".join(text[start : text.index("\n\n", start)].split())
    for command in ("bench", "demo"):
        assert COMMAND_DEFAULTS[command]["world"].shown == "2; under torchrun, its WORLD_SIZE"
    assert "(`--world 2`, under torchrun its `WORLD_SIZE`;" in paragraph
