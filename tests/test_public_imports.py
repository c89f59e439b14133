"""README.md and every example imports only public names: from a module docs/api.md
lists, and only names in its ``__all__`` (issue: a user copying them must not depend on
internals)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = (
    "datacentric",
    "datacentric.models",
    "datacentric.data",
    "datacentric.schedule",
    "datacentric.batch",
)
#: files whose every datacentric import must be public: README.md and every example
CHECKED = ("README.md", *sorted(f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")))


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    else:
        blocks = [text]
    found = []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("datacentric"):
                found.append((node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found += [(a.name, []) for a in node.names if a.name.startswith("datacentric")]
    return found


def test_readme_and_examples_import_only_public_names() -> None:
    problems = []
    for name in CHECKED:
        imports = _imports(ROOT / name)
        assert imports, f"{name}: no datacentric import found (the check would pass vacuously)"
        for module, names in imports:
            if module not in PUBLIC:
                problems.append(f"{name}: {module} is not a public module (docs/api.md)")
                continue
            exported = set(importlib.import_module(module).__all__)
            problems += [
                f"{name}: {module}.{n} is not in __all__" for n in names if n not in exported
            ]
    assert not problems, problems


def test_the_check_catches_an_internal_import(tmp_path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text("from datacentric.data.sources import open_dataset\n", encoding="utf-8")
    assert _imports(planted) == [("datacentric.data.sources", ["open_dataset"])]
    assert "datacentric.data.sources" not in PUBLIC
