"""``make_buckets`` places each distinct text length once (its boundary kept per length)
and every sample by its length: the same bucketing as placing every sample on its own."""

from __future__ import annotations

import bisect

import numpy as np

from datacentric.shapes import SampleShape, bucket_name, default_text_boundaries, make_buckets


def by_hand(shapes: list[SampleShape]) -> tuple[list[tuple[str, SampleShape]], list[int]]:
    """Each sample's boundary worked out on its own, then the buckets sorted by tokens."""
    text = [s.tokens for s in shapes if not s.is_video]
    bounds = default_text_boundaries(max(text))
    keys = [
        s if s.is_video else SampleShape.text(bounds[bisect.bisect_left(bounds, s.tokens)])
        for s in shapes
    ]
    distinct = sorted(set(keys), key=lambda s: (s.tokens, s.grid or (0, 0, 0)))
    longest = {
        k: max(s.tokens for s, key in zip(shapes, keys) if key == k)
        for k in distinct
        if not k.is_video
    }
    buckets = [
        (bucket_name(k), k if k.is_video else SampleShape.text(longest[k])) for k in distinct
    ]
    return buckets, [distinct.index(k) for k in keys]


def test_buckets_of_repeated_lengths_and_videos_are_each_samples_own() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.choice(rng.integers(1, 70_000, size=40), size=600)  # lengths repeat
    shapes = [SampleShape.text(int(t)) for t in lengths]
    shapes += [SampleShape.video(f, 8, 8) for f in rng.integers(1, 5, size=30).tolist()]
    order = rng.permutation(len(shapes))
    shapes = [shapes[i] for i in order]
    bucketing = make_buckets(shapes)
    buckets, of_sample = by_hand(shapes)
    assert [(b.name, b.shape) for b in bucketing.buckets] == buckets
    assert list(bucketing.bucket_of_sample) == of_sample
