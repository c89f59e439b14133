"""The deprecated form of a component given the whole settings object (torch-free).

Each component of a run receives only the sections it reads (``settings.data``,
``settings.checkpoint``); only the top of a run holds the whole
:class:`~datacentric.settings.run_settings.TrainConfig`. A function that took the whole
object in an earlier release still accepts it for one minor version: :func:`passed_whole`
tells it so, with a ``DeprecationWarning`` naming the call to write instead.
"""

from __future__ import annotations

import warnings

from datacentric.settings.run_settings import TrainConfig


def passed_whole(value: object, replacement: str, *, stacklevel: int = 3) -> bool:
    """Whether ``value`` is the whole settings object where a component now takes its
    sections; if so, warn (``DeprecationWarning``) that ``replacement`` is the call to
    write."""
    if not isinstance(value, TrainConfig):
        return False
    warnings.warn(
        f"passing the whole settings (TrainConfig) is deprecated; write {replacement}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return True
