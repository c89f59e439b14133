"""The samples of one micro-batch while a policy builds an iteration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Item:
    """Samples that run as one micro-batch (packed when more than one).

    ``bucket`` is the samples' bucket, or for a ``mixed`` item (samples of several
    buckets packed together) the bucket of its longest sample, which names it.
    """

    bucket: int
    ids: list[int]
    tokens: int
    mixed: bool = False

    @property
    def count(self) -> int:
        return len(self.ids)
