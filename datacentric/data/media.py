"""Raw media for ``datacentric prepare``, by the names it has always had here; each
concern now lives in a module of its own, which the package imports from:

- which clips and captions a source lists (:func:`read_media_source`,
  :class:`MediaItem`, the suffixes and columns it reads):
  :mod:`datacentric.data.media_sources`;
- how a clip or image is read (:func:`probe`, :func:`decode`, :class:`MediaInfo`,
  :class:`MediaError`; PyAV and Pillow, orientation, pixel aspect, 16-bit levels,
  animations): :mod:`datacentric.data.media_decode`;
- the frames and size a clip is encoded at (:func:`plan_clip`, :class:`ClipPlan`,
  :func:`clip_rng`): :mod:`datacentric.data.clip_plans`, with what a family's VAE
  accepts (:class:`Geometry`) in :mod:`datacentric.data.video_geometry` and the frame
  sampling (:func:`even_frames`) in :mod:`datacentric.data.frame_sampling`.
"""

from __future__ import annotations

from datacentric.data.clip_plans import ClipPlan, clip_rng, plan_clip
from datacentric.data.frame_sampling import even_frames
from datacentric.data.media_decode import (
    ANIMATED_FORMATS,
    IMAGE_PLUGINS,
    MediaError,
    MediaInfo,
    decode,
    probe,
)
from datacentric.data.media_sources import (
    CAPTION_COLUMNS,
    IMAGE_SUFFIXES,
    METADATA_FILES,
    PATH_COLUMNS,
    VIDEO_SUFFIXES,
    MediaItem,
    read_media_source,
)
from datacentric.data.video_geometry import Geometry

__all__ = [
    "ANIMATED_FORMATS",
    "CAPTION_COLUMNS",
    "IMAGE_PLUGINS",
    "IMAGE_SUFFIXES",
    "METADATA_FILES",
    "PATH_COLUMNS",
    "VIDEO_SUFFIXES",
    "ClipPlan",
    "Geometry",
    "MediaError",
    "MediaInfo",
    "MediaItem",
    "clip_rng",
    "decode",
    "even_frames",
    "plan_clip",
    "probe",
    "read_media_source",
]
