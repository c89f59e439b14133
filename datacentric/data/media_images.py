"""How ``datacentric prepare`` reads an image file, for
:mod:`datacentric.data.media_decode` (its ``probe`` and ``decode`` of one): with Pillow,
HEIC/HEIF and AVIF through a plugin (:data:`IMAGE_PLUGINS`).

- An animated WebP, PNG (APNG) or AVIF is a clip of its frames (:data:`ANIMATED_FORMATS`),
  counted, timed and composed as browsers play them
  (:mod:`datacentric.data.media_animation`).
- Pixels come upright by the image's EXIF orientation (as ``ImageOps.exif_transpose``
  and diffusers' ``load_image``). A HEIC's or AVIF's turn is its container's (``irot``,
  ``imir``): pillow-heif applies it as it opens the file and clears the EXIF entry,
  Pillow's AVIF reader states it as the EXIF entry, so it is applied once and an EXIF
  entry alone (information only in HEIF) never
  (``tests/runtime/data/test_heif_photos.py``); either is counted as stored turned
  (:attr:`~datacentric.data.media_info.MediaInfo.rotated`).
- Colours are converted to sRGB by the ICC profile the image embeds, else by the
  primaries and transfer its ``nclx`` box states (a HEIC's, through pillow-heif; an
  AVIF's, read from its container: :mod:`datacentric.data.media_boxes`)
  (:mod:`datacentric.data.media_colours`); a 16-bit greyscale image is read by the high
  byte of its levels (a 32-bit integer or float image, which states no range of its
  levels, is refused).
- A file Pillow fails on is a :class:`~datacentric.data.media_info.MediaError` saying
  why: the plugin to install when it is missing; for a picture past Pillow's
  decompression-bomb limit, its pixels and the fix (one under it is read without
  Pillow's warning).
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.data.media_animation import (
    animation_times,
    clear_canvas,
    hidden_frames,
    load_frame,
)
from datacentric.data.media_boxes import BoxError, container_turned, nclx_box
from datacentric.data.media_colours import (
    HDR_TRANSFERS,
    deep_hdr_rgb,
    image_rgb,
    nclx_colours,
    nclx_problem,
)
from datacentric.data.media_info import MediaError, MediaInfo
from datacentric.progress import counted

#: images Pillow reads only through a plugin: suffix -> (its module, how to install it)
#: (HEIC/HEIF: the ``heif`` extra, which asks for the pillow-heif version we read with)
HEIF_INSTALL = "pip install 'datacentric[heif]' (or pip install 'pillow-heif>=0.16')"
IMAGE_PLUGINS = {
    ".heic": ("pillow_heif", HEIF_INSTALL),
    ".heif": ("pillow_heif", HEIF_INSTALL),
    ".avif": (
        "pillow_avif",
        "Pillow 11.3 or later built with libavif, or pip install pillow-avif-plugin",
    ),
}
IMAGE_PLUGINS[".avifs"] = IMAGE_PLUGINS[".avif"]  # an AVIF image sequence
#: Pillow's formats whose files may hold an animation: several frames are a clip (an
#: AVIF image sequence's too; a HEIF file's several pictures are a burst or a bracket)
ANIMATED_FORMATS = ("WEBP", "PNG", "AVIF")


@functools.cache
def _image_plugin(suffix: str) -> str:
    """Registers the Pillow plugin that reads ``suffix`` (:data:`IMAGE_PLUGINS`) when it is
    installed and Pillow lacks the format; else what to install, for the reason given
    when the image cannot be read ("" when nothing is missing)."""
    from PIL import Image

    Image.init()  # the formats Pillow reads, its installed plugins' included
    if suffix not in IMAGE_PLUGINS or suffix in Image.registered_extensions():
        return ""
    module, install = IMAGE_PLUGINS[suffix]
    try:
        plugin = importlib.import_module(module)
    except ImportError:
        return f"; Pillow reads {suffix} images with a plugin: {install}"
    if hasattr(plugin, "register_heif_opener"):  # pillow-avif-plugin registers on import
        plugin.register_heif_opener()
    return ""


def _open_image(path: Path) -> Any:
    """Pillow's (lazy) image of ``path``, through its plugin where it needs one. A
    picture of more pixels than Pillow opens without its decompression-bomb warning (89
    megapixels: a medium-format camera's 100) is read without it: it is the user's own
    file, read whole; one of more than twice as many Pillow refuses
    (:func:`_unreadable_image` names the fix)."""
    from PIL import Image

    _image_plugin(path.suffix.lower())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = Image.open(path)
    try:
        _avif_colours(image, path)
    except BoxError:
        image.close()
        raise
    return image


def _avif_colours(image: Any, path: Path) -> None:
    """Gives an AVIF without an ICC profile the colours its container's ``nclx`` box
    states (:func:`~datacentric.data.media_boxes.nclx_box`) as pillow-heif gives a
    HEIC's, ``info["nclx_profile"]``: Pillow's AVIF reader reads none (its decoder has
    used the box's matrix and range already; its primaries and transfer were lost)."""
    if image.format == "AVIF" and not image.info.get("icc_profile"):
        nclx = nclx_box(path)
        if nclx:
            image.info["nclx_profile"] = nclx


def _unreadable_image(path: Path, err: Exception) -> MediaError:
    """The reason an image is skipped: Pillow's words, and the plugin it lacks; for one
    past Pillow's decompression-bomb limit, its pixels and the fix."""
    from PIL import Image

    if isinstance(err, BoxError):
        return MediaError(str(err))
    if isinstance(err, Image.DecompressionBombError):
        limit = 2 * int(Image.MAX_IMAGE_PIXELS or 0)
        found = re.search(r"\((\d+) pixels\)", str(err))
        pixels = f"{found.group(1)} pixels" if found else "more pixels"
        return MediaError(
            f"too large to read: {pixels}, over the {limit} Pillow reads (as a guard against "
            f"decompression bombs): scale it down to {limit} pixels or fewer first"
        )
    plugin = _image_plugin(path.suffix.lower())
    return MediaError(f"unreadable image ({type(err).__name__}: {err}){plugin}")


def _sixteen_bit(image: Any) -> bool:
    """A greyscale image of 16-bit levels: Pillow's ``I;16`` modes, or ``I`` read from a
    PNG (whose greyscale is at most 16-bit; Pillow before 10 reads it so)."""
    return image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG")


def _level_problem(image: Any) -> str | None:
    """Why an image's levels cannot be shown as 8-bit sRGB, or None: a 32-bit integer or
    float image (Pillow's ``I`` or ``F``) states no range its levels span; colours its
    ``nclx`` box states that cannot be mapped
    (:func:`~datacentric.data.media_colours.nclx_problem`)."""
    if image.mode in ("I", "F") and not _sixteen_bit(image):
        kind = "floating-point" if image.mode == "F" else "32-bit integer"
        return (
            f"a {kind} image (Pillow mode {image.mode}) states no range of its levels: "
            "save it with 8 or 16 bits a level (PNG, TIFF)"
        )
    nclx = nclx_colours(image)
    return nclx_problem(nclx) if nclx else None


def _rgb(image: Any, sixteen: bool) -> Any:
    """An RGB image of ``image``: in sRGB by its colour profile
    (:func:`~datacentric.data.media_colours.image_rgb`); 16-bit levels by their high
    byte, as Pillow reads a 16-bit RGB PNG (its ``convert("RGB")`` clips them at 255
    instead: nearly all white), then converted by the image's profile as 8-bit ones."""
    from PIL import Image

    if not sixteen:
        return image_rgb(image)
    levels = np.asarray(image).astype(np.uint32) >> 8
    grey = Image.fromarray(levels.astype(np.uint8), "L")
    grey.info = dict(image.info)  # its ICC profile or nclx box
    return image_rgb(grey)


def _deep_hdr(image: Any) -> Any:
    """The RGB picture of a HEIC of more than 8 bits a level whose ``nclx`` box states
    HDR (PQ, HLG), mapped from its levels as decoded (read at 16 bits:
    :func:`~datacentric.data.media_colours.deep_hdr_rgb`), or None for any other.
    pillow-heif's Pillow reader gives an RGB one 8-bit levels, a greyscale one 16-bit
    (``I;16``); mapped from 8 bits, a 10-bit HLG ramp reached 183 of sRGB's 256 levels."""
    nclx, bits = nclx_colours(image), int(image.info.get("bit_depth", 8))
    if image.format != "HEIF" or bits <= 8 or not nclx:
        return None
    if int(nclx.get("transfer_characteristics", 2)) not in HDR_TRANSFERS:
        return None
    if image.mode.startswith("I;16"):
        levels = np.repeat(np.asarray(image, dtype=np.uint16)[..., None], 3, -1)
    else:
        import pillow_heif

        heif = pillow_heif.open_heif(image.filename, convert_hdr_to_8bit=False)
        levels = np.asarray(heif[image.tell()])[..., :3]
    # levels of ``bits`` shifted to the top of 16 (1023 as 65472): their top bits
    # repeated below, as from 10 to 16 bits (1023 as 65535, 512 as 32776)
    return deep_hdr_rgb(levels | (levels >> bits), nclx)


def _image_orientation(image: Any) -> int:
    """The EXIF orientation tag of a Pillow image (1, upright, when it has none)."""
    try:
        return int(image.getexif().get(0x0112, 1) or 1)
    except Exception:  # noqa: BLE001 - an unreadable EXIF block is no orientation
        return 1


def _turned_by_container(image: Any, path: Path) -> bool:
    """Whether a HEIC's container turns or mirrors it (``irot``, ``imir``:
    :func:`~datacentric.data.media_boxes.container_turned`): pillow-heif applies the turn
    as it opens the file and clears EXIF's entry, so its pixels come upright, turned once,
    and its orientation reads 1. (Pillow's AVIF reader states an AVIF's turn as EXIF's
    entry.)"""
    return image.format == "HEIF" and container_turned(path)


def _stored_size(image: Any) -> tuple[int, int]:
    """The height and width of an image's pixels as stored, before its EXIF orientation:
    Pillow's size, but a TIFF's from its own ImageLength and ImageWidth tags: Pillow 13
    reports a TIFF's size turned by its orientation already (it turns it as it loads)."""
    tags = getattr(image, "tag_v2", None)
    if image.format == "TIFF" and tags is not None and 256 in tags and 257 in tags:
        return int(tags[257]), int(tags[256])
    return image.height, image.width


def _animation_frames(image: Any) -> int:
    """The frames of an image file: an animated WebP's, PNG's (APNG) or AVIF's all, else
    1 (an MPO photo's second picture, a depth map or preview, is no frame of a clip)."""
    if image.format not in ANIMATED_FORMATS:
        return 1
    return int(getattr(image, "n_frames", 1)) - hidden_frames(image)


def _first_frame(image: Any) -> int:
    """Pillow's frame of an image file's first picture, read before Pillow seeks: an
    animation's first shown frame (past an APNG's still:
    :func:`~datacentric.data.media_animation.hidden_frames`); a still's, the frame Pillow
    opens it at. A HEIF's is its primary picture, the one its ``pitm`` box names and
    viewers show, which need not be the first it lists (a burst's, an edited photo's
    kept with its original); an MPO's or a TIFF's, its first."""
    if image.format in ANIMATED_FORMATS:
        return hidden_frames(image)
    return int(image.tell())


def _probe_image(path: Path, times: bool) -> MediaInfo:
    """:func:`~datacentric.data.media_decode.probe` of an image file: one frame, or an
    animation's frames."""
    try:
        with _open_image(path) as image:
            orientation = _image_orientation(image)
            turned = _turned_by_container(image, path)
            h, w = _stored_size(image)
            problem = _level_problem(image)
            frames = _animation_frames(image)
            stamps = animation_times(image, frames) if times and frames > 1 else None
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
        raise _unreadable_image(path, err) from None
    if problem:
        raise MediaError(problem)
    across = orientation in (5, 6, 7, 8)
    rotated = orientation != 1 or turned
    return MediaInfo(frames, w if across else h, h if across else w, rotated, stamps)


def _pictures(image: Any, order: list[int], first: int, sixteen: bool) -> list[Any]:
    """The upright RGB pictures (:func:`_rgb`) of an image file's frames at ``order``,
    counted from Pillow's frame ``first`` (:func:`_first_frame`: past an APNG's still, a
    HEIF's primary picture). An APNG's are read through every frame before them, each
    composed by its ``load_frame`` (Pillow composes a frame it passes over itself),
    from a clear canvas (``clear_canvas``); another file's are sought directly. A deep
    HDR HEIC's is read at 16 bits instead (:func:`_deep_hdr`)."""
    from PIL import ImageOps

    wanted, pictures = set(order), {}
    steps = range(max(order) + 1) if image.format == "PNG" else sorted(wanted)
    for number in steps:
        image.seek(number + first)
        if first and number == 0 and image.format == "PNG":
            clear_canvas(image)
        deep = _deep_hdr(image) if number in wanted else None  # its levels read once
        if deep is not None:
            pictures[number] = deep
            continue
        load_frame(image)
        if number in wanted:
            pictures[number] = _rgb(ImageOps.exif_transpose(image), sixteen)
    return [pictures[number] for number in order]


def _decode_image(path: Path, indices: list[int] | None) -> list[Any]:
    """:func:`~datacentric.data.media_decode.decode` of an image file: its frame (0), or
    an animation's at ``indices``."""
    try:
        with _open_image(path) as image:
            first, frames = _first_frame(image), _animation_frames(image)
            problem, sixteen = _level_problem(image), _sixteen_bit(image)
            order = list(range(frames)) if indices is None else indices
            if not problem and all(0 <= i < frames for i in order):
                return _pictures(image, order, first, sixteen) if order else []
    except Exception as err:  # noqa: BLE001
        raise _unreadable_image(path, err) from None
    raise MediaError(problem or f"{counted(frames, 'frame')}, frame {max(order)} wanted")
