"""datacentric: Data-Centric Parallel training for variable-length sequences.

``from datacentric import DataCentric`` is the ten-line integration (see
``datacentric.train.data_centric``). The public surface is ``__all__`` here and in
``datacentric.models``, ``datacentric.data``, ``datacentric.schedule`` and
``datacentric.batch`` (docs/api.md); every other module is internal. Heavy modules are
imported on first use, so the pure parts (``datacentric.scheduling``,
``datacentric.planning``) stay light.
"""

from datacentric.lazy_exports import lazy_exports

__version__ = "0.2.0"

# Public name -> the module that defines it (imported on first use).
_LAZY = {
    "DataCentric": "datacentric.train.data_centric",
    "Step": "datacentric.parallel.step",
    "MicroStep": "datacentric.parallel.runtime",
    "TrainConfig": "datacentric.settings.run_settings",
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
