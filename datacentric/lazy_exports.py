"""Public names of a package imported on first use (PEP 562).

A package's ``__init__`` names each public name's defining module; the module is
imported when the name is first read, so importing the package itself stays light
(``import datacentric.models`` or ``datacentric.data`` loads no torch until a name that
needs it is used; the pure layers import their neighbours' plain parts freely).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps each public name to
    the module that defines it. A name read once is kept in the package's namespace."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
