"""What reading a clip or image gives ``datacentric prepare``
(:mod:`datacentric.data.media_decode`): its frames and upright size (:class:`MediaInfo`),
or the reason it cannot be read (:class:`MediaError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class MediaError(ValueError):
    """A clip that cannot be read: the reason, for ``prepare_report.json``."""


@dataclass(frozen=True)
class MediaInfo:
    """A file's frames (1 for a still image) and its upright pixel size."""

    frames: int
    height: int
    width: int
    """Height and width as shown: after an image's EXIF orientation or a video's display
    rotation (a 90-degree turn swaps them)."""
    rotated: bool = False
    """Its pixels are stored turned or mirrored (an EXIF orientation or display rotation
    other than upright); :func:`~datacentric.data.media_decode.decode` returns them
    upright."""
    times: tuple[Any, ...] | None = field(default=None, compare=False)
    """Every frame's timestamp in seconds (``Fraction`` where the stream has them), in
    presentation order: only when :func:`~datacentric.data.media_decode.probe` is asked
    for them."""
