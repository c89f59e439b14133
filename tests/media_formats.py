"""Clips in every container and codec ``prepare`` reads, written with PyAV (the decoder's
own library), for the media tests: MKV (FFV1), WebM (VP9, VP8), AVI (MPEG-4), MOV and
MP4 (H.264, the MP4 with an AAC track before its video; AV1; H.265 apart), GIF; and clips stored
turned or mirrored, with a display matrix; phone photos in HEIC (pillow-heif) and AVIF
(Pillow) turned by their container, their EXIF or both, the colour profiles they
embed (Display P3, profiles written here) or the colours their ``nclx`` box states."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: file name -> (codec, container format, pixel format, audio track first)
FORMATS = {
    "ffv1.mkv": ("ffv1", "matroska", "yuv444p", False),
    "vp9.webm": ("libvpx-vp9", "webm", "yuv420p", False),
    "mpeg4.avi": ("mpeg4", "avi", "yuv420p", False),
    "h264.mov": ("libx264", "mov", "yuv420p", False),
    "audio_first.mp4": ("libx264", "mp4", "yuv420p", True),
    "anim.gif": ("gif", "gif", "rgb8", False),
    "vp8.webm": ("libvpx", "webm", "yuv420p", False),
    "av1.mp4": ("libsvtav1", "mp4", "yuv420p", False),
}

#: a clip for each suffix a media folder lists as a video, in the container its name says
#: (written at 25 fps: MPEG-1 and MXF take broadcast rates only); Ogg holds VP8, as this
#: FFmpeg decodes Theora but has no Theora encoder; QuickTime's older suffix, YUV4MPEG
#: (uncompressed, as lossless test clips come) and IVF (VP8, VP9 or AV1 as encoders write them)
SUFFIX_FORMATS = {
    **{Path(name).suffix: FORMATS[name] for name in ("audio_first.mp4", "h264.mov")},
    **{Path(name).suffix: FORMATS[name] for name in ("ffv1.mkv", "vp9.webm", "mpeg4.avi")},
    ".gif": FORMATS["anim.gif"],
    ".m4v": ("libx264", "mp4", "yuv420p", False),
    ".3gp": ("mpeg4", "3gp", "yuv420p", True),
    ".3g2": ("libx264", "3g2", "yuv420p", False),
    ".mpg": ("mpeg1video", "mpeg", "yuv420p", False),
    ".mpeg": ("mpeg2video", "mpeg", "yuv420p", False),
    ".m2v": ("mpeg2video", "mpeg2video", "yuv420p", False),
    ".vob": ("mpeg2video", "vob", "yuv420p", False),
    ".ts": ("mpeg2video", "mpegts", "yuv420p", False),
    ".mts": ("libx264", "mpegts", "yuv420p", False),
    ".m2ts": ("libx264", "mpegts", "yuv420p", True),
    ".wmv": ("wmv2", "asf", "yuv420p", False),
    ".asf": ("wmv1", "asf", "yuv420p", False),
    ".flv": ("flv", "flv", "yuv420p", False),
    ".f4v": ("libx264", "f4v", "yuv420p", False),
    ".ogv": ("libvpx", "ogg", "yuv420p", False),
    ".mxf": ("mpeg2video", "mxf", "yuv420p", False),
    ".qt": ("libx264", "mov", "yuv420p", False),
    ".y4m": ("rawvideo", "yuv4mpegpipe", "yuv444p", False),
    ".ivf": ("libvpx-vp9", "ivf", "yuv420p", False),
}

#: muxer options by suffix: AVCHD's and Blu-ray's transport streams (192-byte packets)
MUXER_OPTIONS = {".mts": {"mpegts_m2ts_mode": "1"}, ".m2ts": {"mpegts_m2ts_mode": "1"}}

#: H.265 in MP4, written by :func:`write_h265_clip` only (in a child process, 64 x 64)
H265 = ("libx265", "mp4", "yuv420p", False)

#: the encoders' options: lossless-enough H.264, quiet x265, SVT-AV1's fastest preset
OPTIONS = {
    "libx264": {"crf": "0", "preset": "ultrafast"},
    "libx265": {"x265-params": "log-level=error"},
    "libsvtav1": {"preset": "11"},
}


def wave_frames(frames: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    """Smooth colour waves, ``frames`` RGB arrays of ``height x width``."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6.28, size=(3,))
    return [
        np.stack(
            [
                127.5 + 120 * np.sin(x / (5 + c) + y / (7 + c) + t * 0.3 + phase[c])
                for c in range(3)
            ],
            axis=-1,
        ).astype(np.uint8)
        for t in range(frames)
    ]


def _audio(container, stream, seconds: float) -> None:
    import av

    for start in range(0, int(seconds * stream.rate), 1024):
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate, frame.pts = stream.rate, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def write_format_clip(
    path: Path,
    frames: int,
    height: int,
    width: int,
    *,
    seed: int = 0,
    rate: int = 8,
    rotation: int = 0,
    hflip: bool = False,
    spec: tuple[str, str, str, bool] | None = None,
) -> Path:
    """A clip at ``path`` in the format :data:`FORMATS` gives its name (H.264 MP4 for
    another name); ``rotation`` (degrees counter-clockwise) and ``hflip`` (a left-right
    mirror after it) are written as the stream's display matrix; ``spec`` (a
    :data:`FORMATS` value) overrides the name's format; a suffix of
    :data:`MUXER_OPTIONS` is muxed with them."""
    import av

    default = FORMATS.get(path.name, ("libx264", "mp4", "yuv420p", False))
    codec, fmt, pix, audio_first = spec or default
    muxer = MUXER_OPTIONS.get(path.suffix.lower(), {})
    with av.open(str(path), "w", format=fmt, container_options=muxer) as container:
        audio = container.add_stream("aac", rate=8000) if audio_first else None
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, pix
        stream.options = dict(OPTIONS.get(codec, {}))
        if codec == "libsvtav1":
            os.environ.setdefault("SVT_LOG", "1")  # its errors only, not its settings
        if rotation or hflip:
            stream.set_display_rotation(rotation, hflip=hflip)
        for pixels in wave_frames(frames, height, width, seed):
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            _audio(container, audio, frames / rate)
    return path


def write_h265_clip(path: Path, frames: int, *, seed: int = 0) -> Path:
    """A 64 x 64 H.265 MP4 clip, encoded by libx265 in a child process: this PyAV build's
    libx265 corrupts the heap on clips smaller than its 64-pixel coding tree unit (32 x 48
    aborted the process at exit or at a later allocation, 3 runs of 3), so the test
    process never runs it, at a size it handles (64 x 64, 64 x 96, 96 x 64: 39 clips, none
    failed)."""
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from media_formats import H265, write_format_clip; "
        "write_format_clip(Path(sys.argv[2]), int(sys.argv[3]), 64, 64, "
        "seed=int(sys.argv[4]), spec=H265)"
    )
    here = str(Path(__file__).resolve().parent)
    argv = [sys.executable, "-c", code, here, str(path), str(frames), str(seed)]
    subprocess.run(argv, check=True, timeout=120)
    return path


def _fixed(*values: float) -> bytes:
    """ICC's s15Fixed16Number of each value."""
    import struct

    return b"".join(struct.pack(">i", round(v * 65536)) for v in values)


def _xyz(values) -> bytes:
    """An ICC ``XYZ`` tag of one colour."""
    return b"XYZ \0\0\0\0" + _fixed(*values)


def _icc_profile(space: bytes, tags: dict[bytes, bytes]) -> bytes:
    """An ICC v2 display profile of colour ``space`` (``b"RGB "``, ``b"GRAY"``): a
    description, LittleCMS's sRGB's media white and ``tags``."""
    import struct

    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).profile
    text = b"a profile\0"
    tags = {
        b"desc": b"desc\0\0\0\0" + struct.pack(">I", len(text)) + text + bytes(4 + 4 + 2 + 1 + 67),
        b"wtpt": _xyz(srgb.media_white_point[0]),
        **tags,
    }
    table, body, offset = b"", b"", 128 + 4 + 12 * len(tags)
    for name, data in tags.items():
        data += bytes(-len(data) % 4)
        table += name + struct.pack(">II", offset + len(body), len(data))
        body += data
    size = offset + len(body)
    header = struct.pack(">I4sI4s4s4s", size, b"\0" * 4, 0x02100000, b"mntr", space, b"XYZ ")
    header += bytes(12) + b"acsp" + bytes(24) + struct.pack(">I", 0) + _fixed(0.9642, 1.0, 0.8249)
    header += bytes(128 - len(header))
    return header + struct.pack(">I", len(tags)) + table + body


def rgb_profile(curve: bytes, colorants: list | None = None) -> bytes:
    """An ICC v2 display profile written here: each channel's tone ``curve`` (a ``curv``
    tag) and ``colorants`` (red, green and blue's XYZ; LittleCMS's sRGB's when None)."""
    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).profile
    own = [srgb.red_colorant[0], srgb.green_colorant[0], srgb.blue_colorant[0]]
    red, green, blue = colorants or own
    tags = {b"rXYZ": _xyz(red), b"gXYZ": _xyz(green), b"bXYZ": _xyz(blue)}
    return _icc_profile(b"RGB ", {**tags, b"rTRC": curve, b"gTRC": curve, b"bTRC": curve})


def grey_profile(curve: bytes) -> bytes:
    """An ICC v2 greyscale display profile written here: its tone ``curve`` (``kTRC``)."""
    return _icc_profile(b"GRAY", {b"kTRC": curve})


def srgb_curve() -> bytes:
    """sRGB's tone curve as a ``curv`` tag of 1024 entries (as cameras' profiles hold it)."""
    import struct

    level = np.linspace(0, 1, 1024)
    light = np.where(level <= 0.04045, level / 12.92, ((level + 0.055) / 1.055) ** 2.4)
    table = np.round(light * 65535).astype(">u2").tobytes()
    return b"curv\0\0\0\0" + struct.pack(">I", 1024) + table


def display_p3_profile() -> bytes:
    """A Display P3 profile as iPhones embed in their photos: P3's primaries (D65 white,
    adapted to the profile connection space's D50 as in Apple's ``Display P3.icc``) and
    sRGB's tone curve."""
    return rgb_profile(srgb_curve(), DISPLAY_P3_COLORANTS)


#: Display P3's primaries as Apple's profile states them (adapted to D50)
DISPLAY_P3_COLORANTS = [
    (0.5151, 0.2412, -0.0011),
    (0.2920, 0.6922, 0.0419),
    (0.1571, 0.0666, 0.7841),
]


def gamma_curve(gamma: float) -> bytes:
    """A plain power ``gamma`` as a ``curv`` tag of one entry (1.0: linear light)."""
    import struct

    return b"curv\0\0\0\0" + struct.pack(">IH", 1, round(gamma * 256))


#: BT.2020's primaries as ICC profiles state them (adapted to D50)
BT2020_COLORANTS = [(0.6734, 0.2790, -0.0019), (0.1656, 0.6753, 0.0300), (0.1251, 0.0456, 0.7969)]
#: CIE 1931 XYZ as primaries (SMPTE ST 428's, nclx primaries 10: red X, green Y, blue Z,
#: an equal-energy white) as ICC profiles state them (adapted to D50 by Bradford's transform)
XYZ_COLORANTS = [(0.9978, -0.0098, -0.0074), (-0.0042, 1.0183, 0.0135), (-0.0294, -0.0086, 0.8189)]


def write_nclx_heic(path: Path, pixels: np.ndarray, primaries: int, transfer: int) -> Path:
    """A lossless HEIC of ``pixels`` (RGB coded as is) whose colours are stated by its
    ``nclx`` box alone: ``primaries`` and ``transfer`` (H.273's numbers), full range."""
    import pillow_heif
    from PIL import Image

    pillow_heif.register_heif_opener()
    nclx = {"color_primaries": primaries, "transfer_characteristics": transfer}
    Image.fromarray(pixels).save(path, quality=-1, chroma=444, matrix_coefficients=0, **nclx)
    return path


#: nclx primaries and transfer -> the ICC profile of the same colours (Display P3, BT.2020,
#: sRGB's and XYZ's primaries, whose blue and red lie on y = 0; sRGB's tone curve, a power
#: of 2.2, linear light)
NCLX_TWINS = {
    (12, 13): lambda: display_p3_profile(),
    (9, 1): lambda: rgb_profile(srgb_curve(), BT2020_COLORANTS),
    (1, 8): lambda: rgb_profile(gamma_curve(1.0)),
    (12, 4): lambda: rgb_profile(gamma_curve(2.2), DISPLAY_P3_COLORANTS),
    (10, 13): lambda: rgb_profile(srgb_curve(), XYZ_COLORANTS),
}


def write_nclx_avif(path: Path, pixels: np.ndarray, primaries: int, transfer: int) -> Path:
    """An AVIF (PyAV: SVT-AV1, 4:2:0, BT.709 matrix, full range) of ``pixels`` whose
    colours are stated by its ``nclx`` box alone: ``primaries`` and ``transfer`` (H.273's
    numbers), as FFmpeg's AVIF muxer writes them from the stream's colour tags (Pillow's
    AVIF writer states sRGB's always)."""
    import av

    height, width = pixels.shape[:2]
    with av.open(str(path), "w", format="avif") as out:
        stream = out.add_stream("libsvtav1", rate=1, options={"crf": "1", "preset": "11"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
        frame = frame.reformat(format="yuv420p", dst_colorspace=1, dst_color_range=2)
        for owner in (stream.codec_context, frame):
            owner.color_primaries, owner.color_trc = primaries, transfer
            owner.colorspace, owner.color_range = 1, 2
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    return path


#: an EXIF Orientation entry's tag, and a tag no reader knows that holds its place
ORIENTATION_TAG, SPARE_TAG = 0x0112, 0x0113


def _retag(path: Path, old: int, new: int) -> None:
    """Renames the one SHORT EXIF entry tagged ``old`` in ``path``'s bytes to ``new``."""
    import struct

    data, found = path.read_bytes(), []
    for order in ">", "<":
        entry = struct.pack(order + "HHI", old, 3, 1)
        found += [(data.index(entry), order)] if entry in data else []
    assert len(found) == 1, (path, hex(old), found)
    at, order = found[0]
    path.write_bytes(data[:at] + struct.pack(order + "H", new) + data[at + 2 :])


def write_oriented_photo(
    path: Path,
    pixels: np.ndarray,
    orientation: int,
    *,
    container: bool,
    exif: bool,
    icc_profile: bytes | None = None,
) -> Path:
    """A HEIC (pillow-heif, lossless: x265 with RGB coded as is) or AVIF (Pillow's libavif,
    quality 100, 4:4:4) photo of the stored ``pixels`` whose ``orientation`` (EXIF's
    numbering) is stated by the container's ``irot``/``imir`` transforms, in an EXIF
    Orientation entry, or both (as iPhones write a HEIC). Both encoders write the one
    from the other's: the entry that must not be is renamed to :data:`SPARE_TAG` in the
    file, or a spare entry to the Orientation it must be."""
    from PIL import Image

    heic = path.suffix.lower() in (".heic", ".heif")
    tags = Image.Exif()
    if container:
        tags[ORIENTATION_TAG] = orientation
    if exif and (not heic or not container):  # Pillow's AVIF writer moves it into irot/imir
        tags[SPARE_TAG] = orientation
    options = {"quality": -1, "chroma": 444, "matrix_coefficients": 0} if heic else {}
    options = options or {"quality": 100, "subsampling": "4:4:4"}
    if heic:
        import pillow_heif

        pillow_heif.register_heif_opener()
    image = Image.fromarray(pixels)
    image.save(path, exif=tags.tobytes(), icc_profile=icc_profile, **options)
    if heic and container and not exif:
        _retag(path, ORIENTATION_TAG, SPARE_TAG)
    elif exif and (not heic or not container):
        _retag(path, SPARE_TAG, ORIENTATION_TAG)
    return path


def write_ten_bit_heic(path: Path, levels: np.ndarray, **nclx: int) -> Path:
    """A lossless 10-bit HEIC of ``levels`` (an ``H x W x 3`` array of 0 to 1023, or
    ``H x W``: greyscale), its ``nclx`` box's ``color_primaries`` and
    ``transfer_characteristics`` as given (pillow-heif's defaults else)."""
    import pillow_heif

    height, width = levels.shape[:2]
    data = (levels.astype("<u2") << 6).tobytes()  # pillow-heif takes 16-bit levels
    mode = "L;16" if levels.ndim == 2 else "RGB;16"
    heif = pillow_heif.from_bytes(mode=mode, size=(width, height), data=data)
    heif.save(path, quality=-1, chroma=444, matrix_coefficients=0, **nclx)
    return path
