"""How a decoded picture becomes RGB as viewers and players show it on an ordinary
(sRGB, BT.709) display, for :mod:`datacentric.data.media_decode`.

A still image (and each frame of an animated WebP or PNG) is converted to sRGB by the
ICC colour profile it embeds (:func:`image_rgb`; a linear-light or wide-gamut
picture's levels are not sRGB's); an unreadable profile, or one of another kind than
its pixels, is passed over, as viewers pass it. One that states its colours by an
``nclx`` box alone (a HEIC's or AVIF's primaries and transfer) is converted as the ICC
profile of the same colours converts it (:func:`nclx_rgb`), its HDR mapped as a clip's.
A video frame:

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
import threading
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
    profile it embeds (its ``icc_profile``), else by the colours its ``nclx`` box states
    (:func:`nclx_rgb`), else, or where that profile or box is sRGB's
    (:func:`_shows_as_srgb`, :func:`nclx_colours`), its levels taken as sRGB's."""
    icc, mode = image.info.get("icc_profile"), PROFILED_MODES.get(image.mode)
    nclx = nclx_colours(image)
    if nclx:
        return nclx_rgb(image, nclx)
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


#: ``nclx`` transfers (H.273's numbering, FFmpeg's alike) whose levels are shown as sRGB's
#: levels: sRGB's own (13); BT.709's and its kin (1, 6, 11, 12, 14, 15), shown at their
#: levels as a clip's are; unspecified (2) and reserved (0)
SRGB_TRANSFERS = frozenset({0, 1, 2, 6, 11, 12, 13, 14, 15})
#: transfers of a plain power (``light = level ** power``): gamma 2.2, 2.8, linear light
POWER_TRANSFERS = {4: 2.2, 5: 2.8, 8: 1.0}
#: ``nclx`` primaries whose colours are sRGB's: BT.709 (1), unspecified (2), reserved (0)
SRGB_PRIMARIES = frozenset({0, 1, 2})
#: primaries by their ``nclx`` number: red, green, blue and white's chromaticities (x, y)
PRIMARIES = {
    1: ((0.64, 0.33), (0.30, 0.60), (0.15, 0.06), (0.3127, 0.3290)),  # BT.709, sRGB
    9: ((0.708, 0.292), (0.170, 0.797), (0.131, 0.046), (0.3127, 0.3290)),  # BT.2020
    11: ((0.680, 0.320), (0.265, 0.690), (0.150, 0.060), (0.314, 0.351)),  # DCI-P3
    12: ((0.680, 0.320), (0.265, 0.690), (0.150, 0.060), (0.3127, 0.3290)),  # Display P3
}
#: the Bradford cone response, by which ICC profiles adapt one white to another
BRADFORD = np.array(
    [[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]]
)


def nclx_colours(image: Any) -> dict[str, Any] | None:
    """The ``nclx`` box (primaries, transfer) a Pillow picture states its colours by
    when it embeds no ICC profile and they are not sRGB's (:data:`SRGB_PRIMARIES`,
    :data:`SRGB_TRANSFERS`); None for any other (its levels are sRGB's). pillow-heif
    reads a HEIC's as ``info["nclx_profile"]``; an AVIF's is read from its container
    (Pillow's AVIF reader reads none) by :mod:`datacentric.data.media_images`."""
    nclx = image.info.get("nclx_profile")
    if image.info.get("icc_profile") or not isinstance(nclx, dict):
        return None
    primaries = int(nclx.get("color_primaries", 2))
    transfer = int(nclx.get("transfer_characteristics", 2))
    if primaries in SRGB_PRIMARIES and transfer in SRGB_TRANSFERS:
        return None
    return nclx


def _chromaticities(nclx: dict[str, Any]) -> tuple | None:
    """Red, green, blue and white's (x, y) of an ``nclx`` box: by its primaries' number
    (:data:`PRIMARIES`), else as pillow-heif states them; None when neither."""
    code = int(nclx.get("color_primaries", 2))
    known = PRIMARIES.get(1 if code in SRGB_PRIMARIES else code)
    names = [f"color_primary_{c}" for c in ("red", "green", "blue", "white")]
    if known or not all(f"{n}_x" in nclx and f"{n}_y" in nclx for n in names):
        return known
    return tuple((float(nclx[f"{n}_x"]), float(nclx[f"{n}_y"])) for n in names)


def nclx_problem(nclx: dict[str, Any]) -> str | None:
    """Why a picture of the colours an ``nclx`` box states (:func:`nclx_colours`) cannot
    be shown in sRGB, or None: primaries it names no chromaticities of, a transfer of
    neither sRGB's kin, a power nor HDR, HDR the installed PyAV cannot map
    (:func:`maps_to_bt709`)."""
    primaries = int(nclx.get("color_primaries", 2))
    transfer = int(nclx.get("transfer_characteristics", 2))
    fix = "convert it to sRGB (or embed an ICC profile) first"
    if _chromaticities(nclx) is None:
        return f"colours of nclx primaries {primaries}, which are not known here: {fix}"
    if transfer in HDR_TRANSFERS:
        if maps_to_bt709():
            return None
        return (
            f"colours of {HDR_TRANSFERS[transfer]} transfer (nclx), which this PyAV cannot "
            f"map to sRGB as viewers show them: pip install 'av>=18' (with FFmpeg 8), or {fix}"
        )
    if transfer not in SRGB_TRANSFERS and transfer not in POWER_TRANSFERS:
        return f"colours of nclx transfer {transfer}, which is not known here: {fix}"
    return None


def _rgb_to_xyz(chromaticities: tuple) -> np.ndarray:
    """The matrix from linear RGB of these primaries to XYZ (the white's Y 1). Each
    primary is taken as (x, y, 1 - x - y), not divided by its y: XYZ's own primaries
    (nclx 10: red X at (1, 0), blue Z at (0, 0)) have none; the white's scale fixes
    each column's length."""
    xy = np.array(chromaticities, dtype=float)
    xyz = np.stack([xy[:, 0], xy[:, 1], 1 - xy.sum(1)], 1)
    scale = np.linalg.solve(xyz[:3].T, xyz[3] / xyz[3, 1])
    return xyz[:3].T * scale


def _to_srgb_matrix(chromaticities: tuple) -> np.ndarray:
    """The matrix from linear RGB of these primaries to linear sRGB, the white adapted
    to sRGB's (D65) by Bradford's transform, as an ICC profile's is."""
    srgb = _rgb_to_xyz(PRIMARIES[1])
    white = _rgb_to_xyz(chromaticities).sum(1)
    cones = BRADFORD @ srgb.sum(1) / (BRADFORD @ white)
    adapt = np.linalg.inv(BRADFORD) @ np.diag(cones) @ BRADFORD
    return np.linalg.inv(srgb) @ adapt @ _rgb_to_xyz(chromaticities)


def _srgb_light(levels: np.ndarray) -> np.ndarray:
    """Linear light of sRGB levels (0 to 1), by sRGB's tone curve."""
    return np.where(levels <= 0.04045, levels / 12.92, ((levels + 0.055) / 1.055) ** 2.4)


def _srgb_levels(light: np.ndarray) -> np.ndarray:
    """sRGB levels (0 to 1) of linear light, by sRGB's tone curve."""
    light = np.clip(light, 0, 1)
    return np.where(light <= 0.0031308, 12.92 * light, 1.055 * light ** (1 / 2.4) - 0.055)


#: sRGB's transfer in FFmpeg's numbering (``AVCOL_TRC_IEC61966_2_1``), what a still is shown in
SRGB_TRANSFER = 13


#: the rows and width of the blocks an HDR still's pixels are mapped in (:func:`_hdr_rgb`):
#: one frame size for every picture, so the scaler builds its map (2 to 5 s here) once
#: for each transfer and primaries, not again for each size (a camera's landscape and
#: portrait photos alternate); FFmpeg maps each pixel alone, so blocks map as a whole
#: frame does, exactly
HDR_BLOCK = (64, 1024)


@functools.lru_cache(maxsize=8)
def _still_reformatter(transfer: int, primaries: int, deep: bool) -> tuple[Any, threading.Lock]:
    """A PyAV ``VideoReformatter`` for the HDR stills of a process of these colours, of
    8-bit levels or (``deep``) 16-bit ones (:func:`_hdr_rgb`): its scaler keeps its map
    for their blocks (:data:`HDR_BLOCK`); and the lock its users hold, one thread at a
    time (two threads' frames in one scaler crash the process)."""
    from av.video.reformatter import VideoReformatter

    return VideoReformatter(), threading.Lock()


def _hdr_rgb(rgb: np.ndarray, nclx: dict[str, Any]) -> np.ndarray:
    """HDR levels (PQ, HLG; 8-bit, or 16-bit: ``uint16``) mapped to 8-bit sRGB as a
    clip's are mapped to BT.709 (:func:`rgb_picture`: FFmpeg's colour management), to
    sRGB's transfer, in blocks of one size (:data:`HDR_BLOCK`), the last one padded."""
    import av

    transfer = int(nclx["transfer_characteristics"])
    primaries = int(nclx.get("color_primaries", 2))
    deep = rgb.dtype == np.uint16
    reformatter, lock = _still_reformatter(transfer, primaries, deep)
    rows, width = HDR_BLOCK
    pixels, block = rgb.reshape(-1, 3), rows * width
    padded = np.zeros((-(-len(pixels) // block) * block, 3), rgb.dtype)
    padded[: len(pixels)] = pixels
    shown = np.empty(padded.shape, np.uint8)
    for start in range(0, len(padded), block):
        piece = padded[start : start + block].reshape(rows, width, 3)
        frame = av.VideoFrame.from_ndarray(piece, format="rgb48le" if deep else "rgb24")
        frame.color_range, frame.colorspace = 2, 0  # full-range RGB levels
        frame.color_trc, frame.color_primaries = transfer, primaries
        with lock:
            mapped = reformatter.reformat(
                frame, format="rgb24", dst_color_trc=SRGB_TRANSFER, dst_color_primaries=BT709
            ).to_ndarray()
        shown[start : start + block] = mapped.reshape(-1, 3)
    return shown[: len(pixels)].reshape(rgb.shape)


def deep_hdr_rgb(levels: np.ndarray, nclx: dict[str, Any]) -> Any:
    """An RGB image of HDR levels of more than 8 bits (``H x W x 3``, ``uint16`` of 0 to
    65535: a 10- or 12-bit HEIC's) whose ``nclx`` box states PQ or HLG, mapped from all
    their bits as :func:`nclx_rgb` maps 8-bit ones: an HLG ramp of 1024 levels reaches
    all 256 of sRGB, where its 8-bit levels reach 183 (PQ's 128). Raises ``ValueError``
    (:func:`nclx_problem`) where they cannot be shown."""
    from PIL import Image

    problem = nclx_problem(nclx)
    if problem:
        raise ValueError(problem)
    return Image.fromarray(_hdr_rgb(levels, nclx), "RGB")


@functools.lru_cache(maxsize=16)
def _nclx_tables(chromaticities: tuple, transfer: int) -> tuple[Any, Any, Any]:
    """What converts 8-bit levels of these primaries and (SDR) transfer to sRGB, kept
    for each: each level's linear light, the primaries' matrix to sRGB's
    (:func:`_to_srgb_matrix`), and sRGB's levels of 65536 steps of light."""
    levels = np.arange(256) / 255
    power = POWER_TRANSFERS.get(transfer)
    light = (_srgb_light(levels) if power is None else levels**power).astype(np.float32)
    matrix = _to_srgb_matrix(chromaticities).T.astype(np.float32)
    encode = np.round(_srgb_levels(np.linspace(0, 1, 65536)) * 255).astype(np.uint8)
    return light, matrix, encode


#: rows converted at a time (:func:`nclx_rgb`): a 12-megapixel photo's floats in pieces
NCLX_ROWS = 256


def nclx_rgb(image: Any, nclx: dict[str, Any]) -> Any:
    """An RGB image of a Pillow picture whose colours an ``nclx`` box states
    (:func:`nclx_colours`), in sRGB as the ICC profile of those primaries and transfer
    converts it: its levels to linear light by the transfer, its primaries' to sRGB's
    (colours outside sRGB clipped, as LittleCMS clips a display profile's), sRGB's
    transfer (within a level of LittleCMS's conversion, at most 2.3 % of levels off by
    one; about 0.4 s a 12-megapixel photo, as LittleCMS's); HDR (:data:`HDR_TRANSFERS`) mapped by
    :func:`_hdr_rgb`. Raises ``ValueError`` (:func:`nclx_problem`) where it cannot be
    shown."""
    from PIL import Image

    problem = nclx_problem(nclx)
    if problem:
        raise ValueError(problem)
    rgb = np.asarray(image.convert("RGB"))
    transfer = int(nclx.get("transfer_characteristics", 2))
    if transfer in HDR_TRANSFERS:
        return Image.fromarray(_hdr_rgb(rgb, nclx), "RGB")
    light, matrix, encode = _nclx_tables(_chromaticities(nclx), transfer)
    shown = np.empty_like(rgb)
    for top in range(0, rgb.shape[0], NCLX_ROWS):
        mapped = np.clip(light[rgb[top : top + NCLX_ROWS]] @ matrix, 0, 1)
        shown[top : top + NCLX_ROWS] = encode[np.round(mapped * 65535).astype(np.uint16)]
    return Image.fromarray(shown, "RGB")
