"""A profile component measured as zero (timing noise clamped at 0) does not zero the
fitted model's predictions for every other micro-batch."""

from __future__ import annotations

from datacentric.planning.fitted import FittedCostModel, ProfilePoint
from datacentric.shapes import SampleShape

TEXT = SampleShape.text


def point(shapes, block_time_s: float) -> ProfilePoint:
    return ProfilePoint(
        shapes=tuple(shapes),
        sp_size=1,
        base_time_s=0.001,
        block_time_s=block_time_s,
        recompute_time_s=0.1 * block_time_s,
        base_memory_bytes=1000,
        block_memory_bytes=1000,
        recomputed_block_memory_bytes=100,
        transient_memory_bytes=100,
    )


def test_a_zero_block_time_leaves_long_samples_priced():
    points = [
        point([TEXT(97)], 0.0),  # noise: clamped at zero
        point([TEXT(97)] * 4, 0.042),
        point([TEXT(3094)], 0.58),
        point([TEXT(3775)], 0.87),
    ]
    model = FittedCostModel(
        points,
        num_blocks=8,
        attention_kind="causal",
        gpus_per_node=1,
    )
    block = model.components((TEXT(3775),), 1).block_time_s
    assert 0.5 * 0.87 < block < 2 * 0.87
