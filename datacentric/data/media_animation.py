"""How an animated image's frames are counted, timed and composed as browsers play them,
for :mod:`datacentric.data.media_decode` (which reads them with Pillow; a GIF's with
PyAV): an APNG's still for viewers without APNG is no frame (:func:`hidden_frames`); a
frame stating 10 ms or less is shown 100 ms (:func:`shown_seconds`); an APNG frame is
composed as the APNG specification, FFmpeg and browsers compose it where Pillow (13)
does not (:func:`load_frame`, :func:`clear_canvas`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any


def hidden_frames(image: Any) -> int:
    """How many of Pillow's frames of an image file, from the first, are no frames of its
    animation: 1 for an APNG whose plain PNG picture is a still for viewers without APNG
    (no fcTL before its IDAT; Pillow's ``default_image``), which browsers and FFmpeg
    never show in the animation; else 0."""
    hidden = image.format == "PNG" and bool(image.info.get("default_image"))
    return 1 if hidden and int(getattr(image, "n_frames", 1)) > 1 else 0


#: an animation's frame stating this many milliseconds or fewer (or none) is shown for
#: :data:`FLASH_SHOWN_MS`, as Chromium and Firefox show GIF, APNG and WebP frames
FLASH_MS, FLASH_SHOWN_MS = 10, 100


def shown_seconds(ms: Any) -> Fraction:
    """How long browsers show an animation's frame that states ``ms`` milliseconds
    (None: none stated)."""
    stated = Fraction(ms or 0).limit_denominator(10**6)
    return (stated if stated > FLASH_MS else Fraction(FLASH_SHOWN_MS)) / 1000


def gif_starts(starts: list[Any]) -> list[Any]:
    """A GIF's frame starts from FFmpeg's (which reads a 10 ms delay as 10 ms, 0 as
    100 ms) as browsers play them (:func:`shown_seconds`)."""
    shown = starts[:1]
    for before, after in zip(starts, starts[1:]):
        shown.append(shown[-1] + shown_seconds((Fraction(after) - Fraction(before)) * 1000))
    return shown


def animation_times(image: Any, frames: int) -> tuple[Fraction, ...]:
    """Each frame's start in seconds, from the frames' durations in milliseconds (read
    once a frame is loaded; an APNG's fractions kept; a frame stating none, or 10 ms or
    less, is shown 100 ms, as browsers show it: :func:`shown_seconds`)."""
    start, starts, hidden = Fraction(0), [], hidden_frames(image)
    for number in range(frames):
        image.seek(number + hidden)
        image.load()
        starts.append(start)
        start += shown_seconds(image.info.get("duration"))
    return tuple(starts)


#: APNG's ``dispose_op`` that restores a frame's area to the frame before it, and its
#: ``blend_op`` values: a frame's pixels replace its area, or are drawn over it by alpha
APNG_DISPOSE_PREVIOUS, APNG_BLEND_SOURCE, APNG_BLEND_OVER = 2, 0, 1


def blend_apng_frame(image: Any) -> None:
    """Loads an RGBA APNG frame blended over the frame before (``APNG_BLEND_OP_OVER``)
    composed by alpha, as the APNG specification, FFmpeg and browsers compose it:
    Pillow (13) pastes such a frame through its alpha as a mask, half its colour over a
    transparent pixel where it is half transparent. Other frames are left to Pillow."""
    from PIL import Image

    if image.mode != "RGBA" or getattr(image, "blend_op", None) != APNG_BLEND_OVER:
        return
    box = tuple(image.dispose_extent)
    image.blend_op = APNG_BLEND_SOURCE  # Pillow loads the frame's own pixels alone
    image.load()
    under = image._new(image._prev_im).crop(box)
    composed = Image.alpha_composite(under, image.crop(box))
    image.im.paste(composed.im, box)


def load_frame(image: Any) -> None:
    """Loads the frame a Pillow image is at, an APNG frame composed as browsers and
    FFmpeg compose it. A frame disposed to the frame before it
    (``APNG_DISPOSE_OP_PREVIOUS``) and blended over it is composed by Pillow (13) into
    the canvas it keeps to restore from, so the next frame kept its pixels where the
    frame before shows: that canvas is kept as it was and put back. An RGBA frame
    blended over the one before is blended by :func:`blend_apng_frame`."""
    kept = getattr(image, "_prev_im", None)
    if image.format != "PNG" or kept is None:
        image.load()
        return
    restore = getattr(image, "dispose_op", None) == APNG_DISPOSE_PREVIOUS
    before = kept.copy() if restore else None
    blend_apng_frame(image)
    image.load()
    if restore:
        image._prev_im = before


def clear_canvas(image: Any) -> None:
    """Clears the canvas an APNG's first frame is drawn on to transparent black, as the
    APNG specification starts its animation: Pillow draws it over the still it holds
    for viewers without APNG (:func:`hidden_frames`), which showed through."""
    from PIL import Image

    image.im = Image.core.fill(image.mode, image.size)
    image._prev_im = image.im.copy()
