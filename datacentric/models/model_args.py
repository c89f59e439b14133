"""Model arguments as a command line gives them (``--model-arg KEY=VALUE``), and the
error a model string or argument raises: torch-free, so the commands that only price a
model (``plan``, ``schedule``, ``simulate``) read them without importing torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


class ModelSourceError(ValueError):
    """A ``--model`` string or model argument that names no model we can build."""


def parse_model_args(pairs: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--model-arg``) as a dict; a value is read as JSON when
    it is JSON (``2``, ``0.5``, ``true``, ``[1, 2]``), else kept as a string. A mapping
    (a TOML table) passes through."""
    if pairs is None:
        return {}
    if isinstance(pairs, Mapping):
        return dict(pairs)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ModelSourceError(f"model argument {pair!r} is not KEY=VALUE (--model-arg)")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out
