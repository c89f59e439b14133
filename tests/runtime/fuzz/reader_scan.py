"""Where the package reads files: an AST scan for the calls that read one.

A reader is a function (``module:Qualified.name``) holding a call of ``open`` (for
reading), ``.read_text``, ``.read_bytes``, ``json.load``/``json.loads``, ``csv.*``,
``tomllib.load``/``loads``, ``np.load``, ``torch.load``, safetensors' ``safe_open`` /
``load_file``, ``pq.ParquetFile``, or of the package's own readers
(:mod:`datacentric.regular_files`, ``read_text_file``), which wrap ``open``.
"""

from __future__ import annotations

import ast
from pathlib import Path

#: Calls by name that read a file.
READ_NAMES = {
    "open",
    "safe_open",
    "load_file",
    "open_regular",
    "read_regular_text",
    "read_regular_bytes",
    "read_json_file",
    "read_text_file",
}
#: Calls ``X.attr`` that read a file, by attribute (any ``X``) ...
READ_ATTRIBUTES = {"read_text", "read_bytes", "ParquetFile"}
#: ... and by ``(module name, attribute)``.
READ_MODULE_CALLS = {
    ("json", "load"),
    ("json", "loads"),
    ("tomllib", "load"),
    ("tomllib", "loads"),
    ("np", "load"),
    ("numpy", "load"),
    ("torch", "load"),
}


def _is_write_open(call: ast.Call) -> bool:
    """``open(path, "w"...)``, ``open_regular(path, "a")``: a write, not a read."""
    mode = call.args[1] if len(call.args) > 1 else None
    mode = mode or next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax")


def _reads(call: ast.Call) -> str | None:
    """What ``call`` reads with (``json.loads``, ``open``...), None when it reads nothing."""
    func = call.func
    if isinstance(func, ast.Name) and func.id in READ_NAMES:
        return None if _is_write_open(call) else func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if owner == "csv":
            return f"csv.{func.attr}"
        if (owner, func.attr) in READ_MODULE_CALLS:
            return f"{owner}.{func.attr}"
        if func.attr in READ_ATTRIBUTES:
            return f".{func.attr}"
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module, self.stack, self.found = module, [], {}

    def _scope(self, node: ast.AST) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Call(self, node: ast.Call) -> None:
        how = _reads(node)
        if how is not None:
            where = f"{self.module}:{'.'.join(self.stack) or '<module>'}"
            self.found.setdefault(where, set()).add(how)
        self.generic_visit(node)


def find_readers(package: Path) -> dict[str, set[str]]:
    """``{module:qualname: the read calls it holds}`` of every ``.py`` file below
    ``package`` (a folder named like the package), the definitions of the read helpers
    themselves left out."""
    found: dict[str, set[str]] = {}
    root = package.parent
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        scan = _Scan(module)
        scan.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found.update(scan.found)
    return found
