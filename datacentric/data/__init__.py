"""Datasets: the embedded standard-library corpus, synthetic text and video latents.

Every dataset follows :class:`Dataset`: ``len``, ``shapes()``, ``loss_tokens(id)`` and
``pack(sample_ids, pad_to_multiple, *, epoch=0) -> PackedBatch``. Sources by name:
:func:`datacentric.data.sources.open_dataset`.
"""

from datacentric.data.base import (
    DataError,
    Dataset,
    SegmentLayout,
    ShapeListDataset,
    epoch_pack,
    padded_length,
    segment_layout,
)
from datacentric.data.sources import DataSettings, open_dataset
from datacentric.data.stdlib import DEFAULT_MAX_TOKENS, ChunkInfo, StdlibCorpus
from datacentric.data.text import SyntheticTextDataset, pack_token_samples
from datacentric.data.video import (
    RESOLUTIONS,
    VIDEO_FRAMES,
    SyntheticVideoDataset,
    VideoSample,
    benchmark_video_shapes,
    latent_grid,
    video_shape,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "RESOLUTIONS",
    "VIDEO_FRAMES",
    "ChunkInfo",
    "DataError",
    "DataSettings",
    "Dataset",
    "SegmentLayout",
    "ShapeListDataset",
    "StdlibCorpus",
    "SyntheticTextDataset",
    "SyntheticVideoDataset",
    "VideoSample",
    "benchmark_video_shapes",
    "epoch_pack",
    "latent_grid",
    "open_dataset",
    "pack_token_samples",
    "padded_length",
    "segment_layout",
    "video_shape",
]
