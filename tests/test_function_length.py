"""No function of the package is longer than 80 lines (its ``def`` line to its last,
nested functions and methods included): a longer one is split into steps that each
read in one screen. Read from the source; the planted functions check the check."""

from __future__ import annotations

import ast

from repo_paths import ROOT

PACKAGE = ROOT / "datacentric"
LIMIT = 80

#: Functions allowed past the limit for now ("path::name"), each until it is split; an
#: entry whose function fits fails the test, so it goes when the split lands.
ALLOWED: set[str] = set()


def long_functions(source: str, where: str, limit: int = LIMIT) -> dict[str, int]:
    """``{"where::name": lines}`` for each function of ``source`` longer than ``limit``."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > limit:
                found[f"{where}::{node.name}"] = lines
    return found


def package_faults() -> list[str]:
    """Each function of the package past the limit and not allowed, with its length."""
    faults = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for name, lines in long_functions(path.read_text(encoding="utf-8"), where).items():
            if name not in ALLOWED:
                faults.append(f"{name}: {lines} lines (at most {LIMIT})")
    return faults


def test_no_function_is_longer_than_80_lines() -> None:
    faults = package_faults()
    assert not faults, "\n".join(faults)


def test_every_allowance_is_still_needed() -> None:
    """An allowed function that now fits is struck off the list."""
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        long |= long_functions(path.read_text(encoding="utf-8"), where)
    stale = sorted(ALLOWED - set(long))
    assert not stale, f"these fit in {LIMIT} lines now: remove them from ALLOWED: {stale}"


def function(name: str, lines: int) -> str:
    """A function of exactly ``lines`` lines."""
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 2))
    return f"def {name}():\n{body}    return 0\n"


def test_a_planted_81_line_function_is_found() -> None:
    source = function("fits", 80) + function("too_long", 81)
    assert long_functions(source, "planted.py") == {"planted.py::too_long": 81}


def indented(source: str) -> str:
    return "".join(f"    {line}\n" for line in source.splitlines())


def test_a_planted_long_method_and_nested_function_are_found() -> None:
    source = "class C:\n" + indented(function("m", 81))
    source += "def outer():\n" + indented(function("inner", 81))
    found = long_functions(source, "planted.py")
    assert found == {"planted.py::m": 81, "planted.py::outer": 82, "planted.py::inner": 81}
