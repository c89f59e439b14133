"""Deprecated location of the run settings: the schema is :mod:`datacentric.settings`
(torch-free, at the bottom of the package); this module re-exports its names and adds
:func:`sharding`, the run's :class:`~datacentric.planning.sharding.ShardingSpec`."""

from __future__ import annotations

from datacentric.planning.sharding import ShardingSpec
from datacentric.settings.layout import (  # noqa: F401
    PROFILE_FIELDS,
    SECTIONS,
    ProfileSettingsConfig,
    ScheduleOptionsConfig,
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
from datacentric.settings.schema import ConfigError  # noqa: F401
from datacentric.settings.sections import (  # noqa: F401
    CheckpointConfig,
    DataConfig,
    JobConfig,
    MetricsConfig,
    ModelConfig,
    ParallelismConfig,
    Policy,
    ProfilingConfig,
    SchedulingConfig,
    TrainingConfig,
)


def sharding(config: TrainConfig) -> ShardingSpec:
    """The run's ``shard`` setting (raises ``ValueError`` for a bad one)."""
    parallelism = config.parallelism
    return ShardingSpec(parallelism.shard, parallelism.reshard_after_forward)
