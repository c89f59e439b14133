"""Deprecated: the configuration machinery moved to :mod:`datacentric.settings.schema`
(torch-free, below every layer that reads it). This module re-exports its names."""

from __future__ import annotations

from datacentric.settings.schema import (  # noqa: F401
    ConfigError,
    choices_of,
    coerce,
    field_docs,
    field_types,
    setting,
    suggest,
    toml_value,
    type_name,
)
