"""Where the repository's folders are, for a test at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""The ``tests`` folder: the shared helpers (``run_config``, ``user_models``...) live here."""
ROOT = TESTS.parent
"""The repository's root."""
