"""Shared test fixtures. No torch at module level: the tests of the torch-free layers
(``tests/pure``: planning, scheduling, settings, sim) run without importing it.

The tests mirror the package: ``tests/pure/<layer>/`` and ``tests/runtime/<subpackage>/``,
with package-wide tests here. The shared helpers (``run_config``, ``user_models``,
``toy_cost_model``...) live in this folder, which is put on ``sys.path`` for every test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: tiny matmuls on a shared 2-core machine run much faster so.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
