"""The small training configuration the training tests share."""

from __future__ import annotations

from pathlib import Path

from datacentric.settings import TrainConfig, load_config

#: the same small run as command-line flags (for tests that start ``datacentric train``)
SMALL_TRAIN_FLAGS = ["--dataset-limit", "2", "--max-tokens", "256", "--cost-model", "analytic"]
SMALL_TRAIN_FLAGS += ["--tokens-per-iteration", "1024", "--no-progress"]


def small_config(out: Path, **overrides) -> TrainConfig:
    """The demo model on two small corpus files, short steps, analytic cost model."""
    settings = dict(
        model="llama",
        dataset="stdlib",
        dataset_limit=2,
        max_tokens=256,
        tokens_per_iteration=1024,
        cost_model="analytic",
        out=str(out),
        progress=False,
        collective_timeout_s=60.0,
    )
    settings.update(overrides)
    return load_config(None, **settings)
