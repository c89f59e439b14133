"""Shared test fixtures. No torch at module level: the tests of the torch-free layers
(planning, scheduling, settings) run without importing it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
