"""datacentric: Data-Centric Parallel training for variable-length sequences.

``from datacentric import DataCentric`` is the ten-line integration (see
``datacentric.train.data_centric``). Heavy modules are imported on first use, so the pure
parts (``datacentric.scheduling``, ``datacentric.planning``) stay light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["DataCentric", "TrainConfig", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "DataCentric":
        from datacentric.train.data_centric import DataCentric

        return DataCentric
    if name == "TrainConfig":
        from datacentric.train.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'datacentric' has no attribute {name!r}")
