"""Datasets: the embedded standard-library corpus, synthetic text and video latents.

Every dataset follows :class:`Dataset`: ``len``, ``shapes()``, ``loss_tokens(id)`` and
``pack(sample_ids, pad_to_multiple, *, epoch=0) -> PackedBatch``. Sources by name:
:func:`datacentric.data.sources.open_dataset`.
"""

from datacentric.lazy_exports import lazy_exports

# Public name -> the module that defines it (imported on first use: the shape lists of
# ``datacentric.data.workloads`` and ``video`` load without torch).
_LAZY = {
    "DataError": "datacentric.data.base",
    "Dataset": "datacentric.data.base",
    "SegmentLayout": "datacentric.data.base",
    "ShapeListDataset": "datacentric.data.base",
    "epoch_pack": "datacentric.data.base",
    "padded_length": "datacentric.data.base",
    "segment_layout": "datacentric.data.base",
    "DataConfig": "datacentric.settings.sections",
    "DataSettings": "datacentric.data.sources",
    "open_dataset": "datacentric.data.sources",
    "DEFAULT_MAX_TOKENS": "datacentric.data.stdlib",
    "ChunkInfo": "datacentric.data.stdlib",
    "StdlibCorpus": "datacentric.data.stdlib",
    "SyntheticTextDataset": "datacentric.data.text",
    "pack_token_samples": "datacentric.data.text",
    "RESOLUTIONS": "datacentric.data.video_geometry",
    "VIDEO_FRAMES": "datacentric.data.video_geometry",
    "SyntheticVideoDataset": "datacentric.data.video",
    "VideoSample": "datacentric.data.video",
    "benchmark_video_shapes": "datacentric.data.video_geometry",
    "latent_grid": "datacentric.data.video_geometry",
    "video_shape": "datacentric.data.video_geometry",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
