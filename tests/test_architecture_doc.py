"""``docs/architecture.md`` against the tree: its layer drawing names every subpackage
and every bottom module (and nothing that is not there), every module it names exists
where it says, every command module of ``cli/`` is in ``cli/``'s list, and the test
folders it lists are those of ``tests/``. Planted drawings check the checks."""

from __future__ import annotations

import re
from pathlib import Path

from repo_paths import ROOT

DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "datacentric"
#: the root package's own modules, named in the rules rather than the drawing
ROOT_MODULES = {"__init__", "__main__", "lazy_exports"}
FOLDERS = re.compile(r"^  ((?:[a-z_]+/(?: +|$))+)")
MODULE = re.compile(r"(?<![\w/.])([a-z_0-9]+\.py)\b")
PATH = re.compile(r"(?<![\w/.])((?:[a-z_0-9]+/)+[a-z_0-9]+\.py)\b")


def drawing(text: str) -> list[str]:
    """The lines of the code block under ``## Layers``."""
    after = text.split("## Layers", 1)[1]
    return after.split("```", 2)[1].splitlines()[1:]


def drawn(lines: list[str]) -> tuple[dict[str, set[str]], set[str]]:
    """``({folders: the modules named beside them}, the bottom modules)`` of a drawing
    (``folders``: those a line starts with, ``"data models"``; a line without folders
    continues those above it)."""
    groups: dict[str, set[str]] = {}
    bottom: set[str] = set()
    current = ""
    for line in lines:
        found = FOLDERS.match(line)
        if found:
            current = " ".join(f.rstrip("/") for f in found.group(1).split())
            groups.setdefault(current, set())
            line = line[found.end() :]
        elif line.startswith("  ") and MODULE.match(line.strip()):
            current = ""  # the bottom modules' line; the next line describes them
            bottom |= {m.removesuffix(".py") for m in MODULE.findall(line)}
            continue
        if current:
            groups[current] |= set(MODULE.findall(line))
    return groups, bottom


def drawing_faults(lines: list[str], package: Path = PACKAGE) -> list[str]:
    """What the drawing says that the package does not, and what it leaves out."""
    groups, bottom = drawn(lines)
    folders = {f for group in groups for f in group.split()}
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    modules = {p.stem for p in package.glob("*.py")} - ROOT_MODULES
    faults = [f"{name}/ is not in the drawing" for name in sorted(packages - folders)]
    faults += [f"{name}/ is drawn but not in the package" for name in sorted(folders - packages)]
    faults += [f"{name}.py is not in the drawing" for name in sorted(modules - bottom)]
    faults += [f"{name}.py is drawn but not in the package" for name in sorted(bottom - modules)]
    for group, names in groups.items():
        for name in sorted(names):
            if not any((package / folder / name).is_file() for folder in group.split()):
                faults.append(f"{name} is drawn beside {group} but is in none of them")
    return faults


def test_the_drawing_is_the_tree() -> None:
    faults = drawing_faults(drawing(DOC.read_text(encoding="utf-8")))
    assert not faults, "\n".join(faults)


def test_every_module_path_the_doc_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [
        path
        for path in sorted(set(PATH.findall(text)))
        if not (ROOT / path).is_file() and not (PACKAGE / path).is_file()
    ]
    assert not missing, missing


def test_every_command_is_in_the_cli_list() -> None:
    block = "\n".join(drawing(DOC.read_text(encoding="utf-8")))
    cli = block.split("cli/", 1)[1].split("integrations/", 1)[0]
    commands = sorted(
        p.stem
        for p in (PACKAGE / "cli").glob("*.py")
        if re.search(r"^def register\(", p.read_text(encoding="utf-8"), re.M)
    )
    assert commands and not [c for c in commands if not re.search(rf"\b{c}\b", cli)]


def test_the_test_folders_are_the_ones_listed() -> None:
    text = DOC.read_text(encoding="utf-8")
    paragraph = text.split("The tests mirror the package.", 1)[1].split("\n\n", 1)[0]
    for tier in ("pure", "runtime"):
        folders = sorted(p.name for p in (ROOT / "tests" / tier).iterdir() if p.is_dir())
        folders = [f for f in folders if not f.startswith(("_", "."))]
        missing = [f for f in folders if f"`{f}`" not in paragraph]
        assert not missing, f"tests/{tier}/ folders not listed: {missing}"


PLANTED = [
    "  cli/            commands (flags.py)",
    "  data/  models/  datasets | modules (source.py, hf.py)",
    "  batch.py shapes.py",
]


def test_a_planted_drawing_shows_each_fault(tmp_path: Path) -> None:
    package = tmp_path / "datacentric"
    for folder, module in (("cli", "flags.py"), ("data", "x.py"), ("models", "source.py")):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / module).write_text("")
    for module in ("__init__.py", "batch.py", "shapes.py"):
        (package / module).write_text("")
    assert drawing_faults(PLANTED, package) == [
        "hf.py is drawn beside data models but is in none of them"
    ]
    (package / "sim").mkdir()
    (package / "sim" / "__init__.py").write_text("")
    (package / "timing.py").write_text("")
    assert drawing_faults(PLANTED[:2], package) == [
        "sim/ is not in the drawing",
        "batch.py is not in the drawing",
        "shapes.py is not in the drawing",
        "timing.py is not in the drawing",
        "hf.py is drawn beside data models but is in none of them",
    ]
