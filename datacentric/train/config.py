"""Deprecated location (removed in 0.3.0) of the run settings: the schema is
:mod:`datacentric.settings` (torch-free, at the bottom of the package); this module
re-exports its names and warns on import (``DeprecationWarning``)."""

from __future__ import annotations

import warnings

from datacentric.settings.layout import (  # noqa: F401
    SECTIONS,
    section_keys,
    section_of,
)
from datacentric.settings.run_settings import (  # noqa: F401
    TrainConfig,
    build_config,
    field_names,
    file_settings,
    load_config,
    parse_fault,
    validate,
)
from datacentric.settings.scheduling import Policy, SchedulingConfig  # noqa: F401
from datacentric.settings.schema import ConfigError  # noqa: F401
from datacentric.settings.sections import (  # noqa: F401
    CheckpointConfig,
    DataConfig,
    JobConfig,
    MetricsConfig,
    ModelConfig,
    ParallelismConfig,
    ProfilingConfig,
    TrainingConfig,
)

warnings.warn(
    "datacentric.train.config is deprecated and will be removed in 0.3.0: import "
    "TrainConfig and the sections from datacentric.settings instead",
    DeprecationWarning,
    stacklevel=2,
)
