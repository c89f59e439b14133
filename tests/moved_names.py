"""The check a module split by concern shares: a name moved to a new home is still given
by the module it left, as the very object its new home defines."""

from __future__ import annotations

import importlib


def assert_given_as_defined(old: str, new: str, name: str) -> None:
    """``old`` gives ``name`` as the object module ``new`` defines (a class or function
    says ``new`` is where it is defined; a constant is the same object)."""
    left, home = importlib.import_module(old), importlib.import_module(new)
    assert getattr(left, name) is getattr(home, name)
    if not name.isupper():
        assert getattr(home, name).__module__ == home.__name__
