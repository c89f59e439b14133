"""datacentric: Data-Centric Parallel training for variable-length sequences.

``from datacentric import DataCentric`` is the ten-line integration (see
``datacentric.train.data_centric``). The public surface is ``__all__`` here and in
``datacentric.models``, ``datacentric.data``, ``datacentric.schedule`` and
``datacentric.batch`` (docs/api.md); every other module is internal. Heavy modules are
imported on first use, so the pure parts (``datacentric.scheduling``,
``datacentric.planning``) stay light.
"""

from importlib import import_module
from typing import Any

__version__ = "0.2.0"

# Public name -> the module that defines it (imported on first use).
_LAZY = {
    "DataCentric": "datacentric.train.data_centric",
    "Step": "datacentric.parallel.step",
    "MicroStep": "datacentric.parallel.runtime",
    "TrainConfig": "datacentric.train.config",
    "ModelContractError": "datacentric.verify.model_contract",
    "check_model_contract": "datacentric.verify.model_contract",
    "small_dataset": "datacentric.verify.case_models",
}

__all__ = [
    "DataCentric",
    "MicroStep",
    "ModelContractError",
    "Step",
    "TrainConfig",
    "__version__",
    "check_model_contract",
    "small_dataset",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'datacentric' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
