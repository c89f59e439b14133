"""``datacentric models``: the support table comes from the code's checks and tests."""

from __future__ import annotations

import ast
import json
import re

import pytest
from repo_paths import ROOT

from datacentric.verify.support import EVIDENCE, diffusers_rows, support_markdown

DOCS = ROOT / "docs" / "models.md"
#: the table's first line names the library versions it was printed with
MARKER = re.compile(
    r"<!-- support table: datacentric models; transformers (\S+), diffusers (\S+) -->"
)


def check_documented(library: str, version: str, rows: list) -> None:
    """The docs' table of ``library`` is the command's ``rows``: all of it when the
    installed ``version`` is the one the docs name; under another release (which may
    add or drop classes), the row of every class both know, word for word."""
    docs = DOCS.read_text(encoding="utf-8")
    found = MARKER.search(docs)
    assert found, "docs/models.md: the support table's first line names no versions"
    documented_version = dict(zip(("transformers", "diffusers"), found.groups()))[library]
    table = support_markdown(library, rows)
    if version == documented_version:
        assert table in docs
        return
    block = docs[docs.index(f"### {library} (") :]
    block = block[: block.index("<!-- end")].split("\n### ")[0]
    documented = {row.split(" | ")[0]: row for row in block.splitlines() if row.startswith("| `")}
    common = [row for row in table.splitlines() if row.split(" | ")[0] in documented]
    assert common, f"no class of {library} {version} is in the docs' table"
    for row in common:
        assert documented[row.split(" | ")[0]] == row


def _test_exists(test_id: str) -> bool:
    """``path::name[param]``: the file defines ``name`` and names ``param`` literally."""
    path, _, rest = test_id.partition("::")
    name, _, param = rest.partition("[")
    file = ROOT / path
    if not file.is_file():
        return False
    text = file.read_text(encoding="utf-8")
    defined = {n.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
    return name in defined and (not param or f'"{param.rstrip("]")}"' in text)


@pytest.mark.parametrize("class_name", sorted(EVIDENCE))
def test_every_evidence_is_a_test_of_this_repository(class_name: str) -> None:
    for test_id in EVIDENCE[class_name]:
        assert _test_exists(test_id), test_id


def test_every_diffusers_transformer_class_has_one_row() -> None:
    diffusers = pytest.importorskip("diffusers")
    from datacentric.models.diffusers_build import TINY_DIFFUSERS

    rows = list(diffusers_rows())
    installed = {n for n in dir(diffusers) if re.search(r"Transformer[23]DModel$", n)}
    assert sorted(r["class"] for r in rows) == sorted(installed)
    by_class = {r["class"]: r for r in rows}
    trained = {cls for cls, config in TINY_DIFFUSERS.values() if config}
    assert {c for c, r in by_class.items() if r["status"] == "exact"} == trained
    for row in rows:
        assert row["status"] in ("exact", "refused", "untested")
        assert (row["evidence"] is not None) == (row["status"] == "exact"), row
        assert row["reason"] and "\n" not in row["reason"]
    ltx2 = by_class["LTX2VideoTransformer3DModel"]
    assert ltx2["status"] == "refused" and "audio_hidden_states" in ltx2["reason"]
    check_documented("diffusers", diffusers.__version__, rows)


@pytest.mark.slow
def test_the_command_prints_one_json_line_of_both_libraries(capsys) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    from datacentric.cli.main import main

    assert main(["models", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    table = json.loads(lines[0])
    exact = {r["class"] for rows in table.values() for r in rows if r["status"] == "exact"}
    assert exact == set(EVIDENCE)
    refused = {r["class"]: r["reason"] for r in table["transformers"] if r["status"] == "refused"}
    assert any("cannot run exactly" in reason for reason in refused.values())
    check_documented("transformers", transformers.__version__, table["transformers"])
