"""``train/`` reads by concern: the run loop at its own level, one concern per folder
beside it, and each folder's opening docstring says what it holds. The docstring of a
folder's ``__init__`` names every module of the folder (``:mod:`.name``` or
``name.py``) and every folder inside it (``name/``); ``train/`` itself is checked the
same way. Read from the source; planted folders check the check."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import ROOT

TRAIN = ROOT / "datacentric" / "train"


def docstring_faults(folder: Path) -> list[str]:
    """What the opening docstring of ``folder`` leaves out of what the folder holds."""
    init = folder / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    if not doc.strip():
        return [f"{folder.name}/__init__.py has no docstring saying what the folder holds"]
    modules = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
    faults = [
        f"{folder.name}/{name}.py is not named in {folder.name}/__init__.py's docstring"
        for name in modules
        if f":mod:`.{name}`" not in doc and f"``{name}.py``" not in doc
    ]
    folders = sorted(p.parent.name for p in folder.glob("*/__init__.py"))
    faults += [
        f"{folder.name}/{name}/ is not named in {folder.name}/__init__.py's docstring"
        for name in folders
        if f"``{name}/``" not in doc
    ]
    return faults


def layout_faults(train: Path) -> list[str]:
    """The docstring faults of ``train`` and of every folder in it."""
    faults = docstring_faults(train)
    for init in sorted(train.glob("*/__init__.py")):
        faults += docstring_faults(init.parent)
    return faults


def test_every_train_folder_says_what_it_holds() -> None:
    assert not layout_faults(TRAIN), "\n".join(layout_faults(TRAIN))


def test_a_module_or_folder_left_out_of_its_docstring_is_found(tmp_path) -> None:
    train = tmp_path / "train"
    (train / "loop").mkdir(parents=True)
    (train / "__init__.py").write_text('"""The loop, ``trainer.py``; ``loop/``."""\n')
    (train / "trainer.py").write_text("")
    (train / "loop" / "__init__.py").write_text('"""- :mod:`.steps`: the steps."""\n')
    (train / "loop" / "steps.py").write_text("")
    assert layout_faults(train) == []
    (train / "schedule.py").write_text("")
    (train / "loop" / "saves.py").write_text("")
    (train / "reports").mkdir()
    (train / "reports" / "__init__.py").write_text("")
    assert layout_faults(train) == [
        "train/schedule.py is not named in train/__init__.py's docstring",
        "train/reports/ is not named in train/__init__.py's docstring",
        "loop/saves.py is not named in loop/__init__.py's docstring",
        "reports/__init__.py has no docstring saying what the folder holds",
    ]
