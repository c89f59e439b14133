"""A user's own model: a ``pkg.module:factory`` source, built by calling the factory
with the model arguments as keyword arguments (checked against its parameters, unless
it takes ``**kwargs``); it returns the model, or ``(model, dataset)``."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from typing import Any

import torch
from torch import nn

from datacentric.models.model_args import ModelSource, ModelSourceError, check_model_args


def factory_of(source: ModelSource) -> Any:
    """The user's factory callable of a ``pkg.module:factory`` source."""
    module_name, _, attr = source.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelSourceError(
            f"model {source.name!r}: cannot import {module_name!r} ({error})"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSourceError(f"model {source.name!r}: {module_name} has no callable {attr!r}")
    return factory


def build_factory_source(
    source: ModelSource, *, dtype: torch.dtype, device: Any
) -> tuple[nn.Module, Any]:
    """The model the factory returns (under ``device`` when given, in ``dtype``), and
    the dataset it returned beside it (else ``None``)."""
    factory = factory_of(source)
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        check_model_args(source, params, f"factory {source.target}")
    with torch.device(device) if device is not None else contextlib.nullcontext():
        made = factory(**source.args)
    model, data = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ModelSourceError(
            f"model {source.name!r}: the factory returned {type(model).__name__}, not an "
            "nn.Module (or a (model, dataset) pair)"
        )
    return model.to(dtype=dtype), data
