"""How a decoded video frame is shown as players show it, for
:mod:`datacentric.data.media_decode`: turned by its display rotation (its display
matrix, else its ``rotate`` tag: :func:`_display_turns`, applied by :func:`_upright`),
its non-square pixels (its sample aspect ratio: :func:`_pixel_aspect`) shown square
(:func:`_square_pixels`), and its colours as RGB (:func:`_picture`, by
:mod:`datacentric.data.media_colours`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from datacentric.data.media_colours import rgb_picture
from datacentric.data.media_info import MediaError


def _display_matrix(frame: Any) -> list[int] | None:
    """The 3 x 3 display matrix of a decoded frame (FFmpeg's ``int32`` layout), or None.
    Its side data are taken by position: PyAV 18.1.1 iterates their types, earlier
    versions the data themselves."""
    side = getattr(frame, "side_data", None)
    for index in range(len(side) if side is not None else 0):
        data = side[index]
        if getattr(data.type, "name", "") == "DISPLAYMATRIX" and len(bytes(data)) == 36:
            return list(np.frombuffer(bytes(data), dtype=np.int32))
    return None


def _display_turns(frame: Any, stream: Any) -> tuple[str, ...]:
    """The ``PIL.Image.Transpose`` names that show a decoded frame as players show it,
    by FFmpeg's own autorotate rule on its display matrix (rotations by a multiple of 90
    degrees and mirrors); a stream with no matrix but a ``rotate`` tag (degrees
    clockwise) is turned by that. Other angles are left as stored."""
    matrix = _display_matrix(frame)
    if matrix is None:
        try:
            clockwise = round(float(stream.metadata.get("rotate", 0))) % 360
        except ValueError:
            clockwise = 0
        return {90: ("ROTATE_270",), 180: ("ROTATE_180",), 270: ("ROTATE_90",)}.get(clockwise, ())
    clockwise = -round(getattr(frame, "rotation", 0) or 0) % 360
    if clockwise == 90:
        return ("TRANSPOSE",) if matrix[3] > 0 else ("ROTATE_270",)
    if clockwise == 270:
        return ("TRANSVERSE",) if matrix[3] < 0 else ("ROTATE_90",)
    if clockwise == 180:
        flips = (("FLIP_LEFT_RIGHT", matrix[0] < 0), ("FLIP_TOP_BOTTOM", matrix[4] < 0))
        return tuple(name for name, flip in flips if flip)
    if clockwise == 0 and matrix[4] < 0:
        return ("FLIP_TOP_BOTTOM",)
    return ()


def _pixel_aspect(stream: Any) -> Fraction:
    """The width over the height of one stored pixel of a video (its sample aspect
    ratio: 4:3 for HDV's 1440 x 1080 shown 1920 x 1080; 1 when unstated, or outside
    1/8 to 8, which no camera writes)."""
    context = getattr(stream, "codec_context", None)
    for stated in (
        getattr(stream, "sample_aspect_ratio", None),
        getattr(context, "sample_aspect_ratio", None),
    ):
        if stated and Fraction(1, 8) <= Fraction(stated) <= 8:
            return Fraction(stated)
    return Fraction(1)


def _square_width(width: int, aspect: Fraction) -> int:
    """The width of a row of ``width`` pixels of ``aspect`` in square pixels."""
    return max(1, round(width * aspect))


def _square_pixels(image: Any, aspect: Fraction) -> Any:
    """A frame of pixels of ``aspect`` resized to square pixels, as players show it
    (its width scaled, as FFmpeg's ``scale=iw*sar:ih``; Lanczos, as diffusers resizes)."""
    from PIL import Image

    if aspect == 1:
        return image
    size = (_square_width(image.width, aspect), image.height)
    return image.resize(size, Image.Resampling.LANCZOS)


def _upright(image: Any, turns: tuple[str, ...]) -> Any:
    """``image`` transposed by each of ``turns`` (``PIL.Image.Transpose`` names), exactly."""
    from PIL import Image

    for name in turns:
        image = image.transpose(Image.Transpose[name])
    return image


def _picture(frame: Any, reformatter: Any) -> Any:
    """A decoded frame as RGB as players show it (:func:`~datacentric.data.media_colours.
    rgb_picture`); :class:`MediaError` when the installed PyAV cannot show its colours."""
    picture = rgb_picture(frame, reformatter)
    if isinstance(picture, str):
        raise MediaError(picture)
    return picture
