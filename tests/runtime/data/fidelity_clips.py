"""What the media fidelity tests share (``test_clip_streams``, ``test_clip_colours``,
``test_clip_frame_counts``, ``test_packet_frame_counts``, ``test_image_profiles``): a
listed item of a file, a decoded picture's error from the pixels written, lossless
H.264 options, and the frames probe and decode take from their decoder, counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from datacentric.data.media_sources import MediaItem

#: lossless H.264 in 4:4:4 with a keyframe every 4 frames and no B-frames
H264_GOP4 = {"qp": "0", "preset": "ultrafast", "g": "4", "bf": "0"}


def _item(path: Path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


def _error(got, want) -> float:
    """The mean absolute difference of a decoded picture from the pixels written."""
    return float(np.abs(np.asarray(got, dtype=float) - want).mean())


def count_decoded(monkeypatch) -> list:
    """The frames ``probe`` and ``decode`` take from their decoder from now on, listed as
    they come (``media_decode._Frames`` patched for the test)."""
    from datacentric.data import media_decode

    frames: list = []

    class Counted(media_decode._Frames):
        def __iter__(self):
            for frame in super().__iter__():
                frames.append(frame)
                yield frame

    monkeypatch.setattr(media_decode, "_Frames", Counted)
    return frames
