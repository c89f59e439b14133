"""How a decoded picture becomes RGB as viewers and players show it on an ordinary
(sRGB, BT.709) display, for :mod:`datacentric.data.media_decode`.

A still image (and each frame of an animated WebP or PNG) is converted to sRGB by the
ICC colour profile it embeds (:func:`image_rgb`; a linear-light or wide-gamut
picture's levels are not sRGB's); an unreadable profile, or one of another kind than
its pixels, is passed over, as viewers pass it. A video frame:

- by the colour matrix and range the frame states (BT.709, BT.601, BT.2020; limited or
  full range): PyAV 17 or later reads them (:func:`colour_problem` names an earlier
  one);
- a frame that states no matrix by the one players guess from its size: BT.709 above
  576 lines or from 1280 pixels wide (high definition), else BT.601 (FFmpeg's scaler
  alone takes BT.601 whatever the size);
- an HDR frame (PQ or HLG transfer) or one of BT.2020 primaries mapped to BT.709, as
  players map it (FFmpeg 8's colour management, through PyAV 18's ``dst_color_trc`` and
  ``dst_color_primaries``): levels above the reference white (HLG's 75 % signal, PQ's
  203 nits) are clipped, colours outside BT.709 brought inside it. A PyAV that cannot
  map them is named (:func:`rgb_picture`), not read in flat colours: its levels
  converted alone, an HLG clip's reference white is 191 of 255, a PQ clip's 148.
"""

from __future__ import annotations

import functools
import io
from typing import Any

import numpy as np

#: the first PyAV whose frames turn to RGB by their own colour matrix and range
#: (FFmpeg's ``sws_scale_frame``); earlier ones convert every frame as BT.601 of limited
#: range unless told, and are not told right through ``to_image``'s arguments
COLOUR_PYAV = 17
#: transfers (``AVColorTransferCharacteristic``) and primaries (``AVColorPrimaries``)
#: that players map to BT.709: HDR's, and BT.2020's wide gamut
HDR_TRANSFERS = {16: "PQ", 18: "HLG"}
WIDE_PRIMARIES = {9: "BT.2020"}
#: BT.709's matrix, transfer and primaries (each 1 in FFmpeg's numbering)
BT709 = 1
#: FFmpeg's ``AVCOL_SPC_UNSPECIFIED``: a frame that states no matrix
UNSTATED_MATRIX = 2


def colour_problem(version: str) -> str | None:
    """Why frames decoded by PyAV ``version`` would not show the file's colours, or None."""
    if int(version.split(".")[0]) >= COLOUR_PYAV:
        return None
    return (
        f"PyAV {version} converts every clip's colours as BT.601 of limited range, whatever "
        f"the clip states (BT.709, full range): pip install 'av>={COLOUR_PYAV}'"
    )


def _tag(frame: Any, name: str) -> int:
    """A frame's colour tag ``name`` as FFmpeg numbers it (0 where PyAV reads none)."""
    value = getattr(frame, name, 0)
    return int(getattr(value, "value", value) or 0)


def wide_colours(frame: Any) -> str:
    """What of a decoded frame's colours players map to BT.709 ("" when nothing): its HDR
    transfer, its BT.2020 primaries."""
    transfer, primaries = _tag(frame, "color_trc"), _tag(frame, "color_primaries")
    named = [
        f"{HDR_TRANSFERS[transfer]} transfer" if transfer in HDR_TRANSFERS else "",
        f"{WIDE_PRIMARIES[primaries]} primaries" if primaries in WIDE_PRIMARIES else "",
    ]
    return ", ".join(n for n in named if n)


@functools.cache
def maps_to_bt709() -> bool:
    """Whether the installed PyAV's scaler maps a frame's transfer and primaries to
    BT.709 when asked: an HLG grey at its reference white (75 % signal) comes out near
    white (253 with PyAV 18.1), where its levels converted alone give 191 (PyAV 17.0
    takes the arguments and converts the levels alone)."""
    import av

    planes = np.stack([np.full((2, 2), 180), np.full((2, 2), 128), np.full((2, 2), 128)])
    frame = av.VideoFrame.from_ndarray(planes.astype(np.uint8), format="yuv444p")
    try:
        frame.color_range, frame.colorspace = 1, 9
        frame.color_trc, frame.color_primaries = 18, 9
        mapped = frame.reformat(format="rgb24", dst_color_trc=BT709, dst_color_primaries=BT709)
        return int(mapped.to_ndarray()[0, 0, 1]) > 230
    except Exception:  # noqa: BLE001 - a PyAV without the arguments maps nothing
        return False


def guessed_matrix(frame: Any) -> dict[str, int]:
    """The ``reformat`` argument that converts a frame stating no colour matrix by the
    one players guess for its size (BT.709 for high definition: above 576 lines, or
    1280 pixels wide or more); nothing for a frame that states one, or a smaller one
    (BT.601, FFmpeg's own default)."""
    if _tag(frame, "colorspace") != UNSTATED_MATRIX:
        return {}
    return {"src_colorspace": BT709} if frame.height > 576 or frame.width >= 1280 else {}


def mapping_problem(frame: Any) -> str | None:
    """Why a decoded frame's HDR or BT.2020 colours cannot be shown as players show
    them with the installed PyAV (:func:`maps_to_bt709`), or None."""
    wide = wide_colours(frame)
    if not wide or maps_to_bt709():
        return None
    import av

    return (
        f"colours of {wide}, which PyAV {av.__version__} cannot map to BT.709 as players "
        "show them: pip install 'av>=18' (with FFmpeg 8), or convert the clip to BT.709 first"
    )


def rgb_picture(frame: Any, reformatter: Any) -> Any:
    """A decoded frame as an RGB ``PIL.Image`` as players show it (see the module
    docstring), or, where the installed PyAV cannot map its HDR or BT.2020 colours to
    BT.709, the reason (a ``str``: :func:`mapping_problem`). ``reformatter`` (a PyAV
    ``VideoReformatter``, one for a clip's frames) maps them: its scaler builds its map
    once, about 4 s here, and keeps it while the frames' size and colours stay."""
    matrix = guessed_matrix(frame)
    if not wide_colours(frame):
        return frame.to_image(**matrix)
    problem = mapping_problem(frame)
    if problem:
        return problem
    mapped = reformatter.reformat(
        frame, format="rgb24", dst_color_trc=BT709, dst_color_primaries=BT709, **matrix
    )
    return mapped.to_image()


#: Pillow modes an ICC profile converts from, each as LittleCMS takes it
PROFILED_MODES = {"RGB": "RGB", "RGBA": "RGB", "P": "RGB", "PA": "RGB", "L": "L", "LA": "L"}
PROFILED_MODES |= {"1": "L", "CMYK": "CMYK"}


@functools.cache
def _srgb() -> Any:
    """LittleCMS's sRGB profile, what an image is shown in."""
    from PIL import ImageCms

    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def _samples(mode: str) -> Any:
    """Colours of LittleCMS ``mode`` ("RGB" or "L") an embedded profile is checked on:
    every combination of 17 levels a channel and each channel's 256 levels alone (RGB),
    the 256 greys (L); None for CMYK, whose levels are never sRGB's."""
    from PIL import Image

    ramp = np.arange(256, dtype=np.uint8)
    if mode == "L":
        return Image.fromarray(ramp[None], "L")
    if mode != "RGB":
        return None
    grid = np.linspace(0, 255, 17).round().astype(np.uint8)
    mixed = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), -1).reshape(-1, 3)
    alone = np.zeros((3, 256, 3), np.uint8)
    for channel in range(3):
        alone[channel, :, channel] = ramp
    return Image.fromarray(np.concatenate([mixed, alone.reshape(-1, 3)])[None], "RGB")


@functools.lru_cache(maxsize=64)
def _shows_as_srgb(icc: bytes, mode: str) -> bool:
    """Whether an embedded ICC profile shows pixels of ``mode`` at their own levels in
    sRGB, within a level (:func:`_samples`): the sRGB profiles cameras, phones and
    editors embed. Such a picture is taken as stored, exactly, and spared the
    conversion (about 12 ms a 1024 x 768 photo, 4 times its JPEG decoding); the answer
    is kept for each profile. Raises as LittleCMS does on a profile it cannot read."""
    from PIL import ImageCms

    samples = _samples(mode)
    if samples is None:
        return False
    source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    shown = ImageCms.profileToProfile(samples, source, _srgb(), outputMode="RGB")
    stored = np.asarray(samples.convert("RGB"), dtype=np.int16)
    return bool(np.abs(np.asarray(shown, dtype=np.int16) - stored).max() <= 1)


def image_rgb(image: Any) -> Any:
    """An RGB image of a Pillow picture as viewers show it: converted to sRGB by the ICC
    profile it embeds (its ``icc_profile``), else, or where that profile is sRGB's
    (:func:`_shows_as_srgb`), its levels taken as sRGB's."""
    icc, mode = image.info.get("icc_profile"), PROFILED_MODES.get(image.mode)
    if not (icc and mode):
        return image.convert("RGB")
    from PIL import ImageCms

    try:
        if _shows_as_srgb(bytes(icc), mode):
            return image.convert("RGB")
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        pixels = image if image.mode == mode else image.convert(mode)
        return ImageCms.profileToProfile(pixels, source, _srgb(), outputMode="RGB")
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return image.convert("RGB")  # an unreadable profile, or of another kind: as sRGB
