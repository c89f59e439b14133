"""A pytest plugin that makes ``import torch`` fail, for the torch-free tests:
``python -m pytest -p no_torch tests/pure`` (``make test`` runs them so) proves that the
pure layers (planning, scheduling, settings, sim) and their tests never need torch."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class TorchBlocked(MetaPathFinder):
    """Refuses ``torch`` and its submodules: the import raises ``ImportError``."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} imported by a torch-free test (tests/pure)")
        return None


if "torch" in sys.modules:  # pragma: no cover - loaded too late to prove anything
    raise RuntimeError("no_torch: torch was imported before the plugin loaded")
sys.meta_path.insert(0, TorchBlocked())
