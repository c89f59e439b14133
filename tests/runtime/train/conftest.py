"""Fixtures the training tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """An uninterrupted world-2 run of 6 steps (a checkpoint after step 3): what a
    resumed run must equal bitwise, however it was stopped and saved (its folder is
    only read)."""
    from run_config import small_config

    from datacentric.parallel.launch import spawn
    from datacentric.train.trainer import train_rank

    config = small_config(tmp_path_factory.mktemp("straight"), iterations=6, checkpoint_every=3)
    spawn(train_rank, 2, config, timeout_s=600)
    return config
