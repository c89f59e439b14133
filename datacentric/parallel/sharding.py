"""Deprecated module: :mod:`datacentric.parallel.sequence_shards` (a micro-batch's
sequence shards across its SP group; "sharding" of model state is
:mod:`datacentric.planning.sharding`)."""

from __future__ import annotations

import warnings

from datacentric.parallel.sequence_shards import shard_batch, shard_bounds

__all__ = ["shard_batch", "shard_bounds"]

warnings.warn(
    "datacentric.parallel.sharding is deprecated: import datacentric.parallel.sequence_shards",
    DeprecationWarning,
    stacklevel=2,
)
