"""Deprecated alias of :mod:`datacentric.batch` (moved there after 0.1.0).

``from datacentric.models.batch import PackedBatch`` still works and gives the very class
of :mod:`datacentric.batch`, with a ``DeprecationWarning``; this module goes in 0.3.0.
"""

import warnings

from datacentric.batch import PER_TOKEN_FIELDS, PackedBatch

__all__ = ["PER_TOKEN_FIELDS", "PackedBatch"]

warnings.warn(
    "datacentric.models.batch is deprecated and will be removed in 0.3.0: import "
    "PackedBatch from datacentric.batch instead",
    DeprecationWarning,
    stacklevel=2,
)
