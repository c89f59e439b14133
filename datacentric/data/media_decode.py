"""How ``datacentric prepare`` reads a clip or image listed by
:mod:`datacentric.data.media_sources`: its frames and upright size (:func:`probe`) and
its frames as RGB pictures (:func:`decode`).

- Videos are read with PyAV (``av``, in the ``video`` extra), images with Pillow; both
  give RGB :class:`PIL.Image.Image` frames; an animated WebP, PNG (APNG) or AVIF is a
  clip of its frames, timed by their durations (one of 10 ms or less, a GIF's too, shown
  100 ms, as browsers show it). Every container and codec the installed
  PyAV decodes is read (MP4, MOV, MKV, WebM, AVI, GIF, 3GP, MPEG program and transport
  streams, ASF/WMV, FLV, Ogg, MXF, YUV4MPEG, IVF; H.264, H.265, VP8, VP9, AV1,
  MPEG-1/2/4, WMV, FFV1 as its FFmpeg has them), from the video stream players open
  (the default one, else the first); audio and other streams are never decoded. A
  clip's frame count is its stream's when the container states one, else the frames
  that decode (Matroska and WebM state none; an AVI states its frame slots, a picture
  held over a gap counted again). A clip cut before its first keyframe
  plays from that keyframe, as players show it. An interlaced clip is deinterlaced as
  players show it (FFmpeg's ``bwdif``, one frame per frame: :func:`_deinterlaced`).
- Colours are the file's, as players show them on an ordinary display
  (:mod:`datacentric.data.media_colours`): each frame is converted to RGB by the colour
  matrix and range it states (BT.709 or BT.601, limited or full range; PyAV 17 or
  later, which reads them; an earlier PyAV is named as the reason no clip is read; a
  frame stating none by the one players guess from its size), and
  an HDR (PQ, HLG) or BT.2020 frame is mapped to BT.709; an image is converted to
  sRGB by the ICC profile it embeds. Levels of more than 8 bits
  (10-, 12-bit) are scaled to 8; a clip's alpha channel is dropped, its colours kept
  as stored (not composited over a background); a GIF's transparent pixels are
  white, as FFmpeg's GIF decoder gives them.
- Pixels come upright: an image's EXIF orientation (as ``ImageOps.exif_transpose`` and
  diffusers' ``load_image``) and a video's display rotation (its display matrix, else
  its ``rotate`` tag) are applied before sizes are planned and frames resized. A HEIC's
  or AVIF's turn is its container's (``irot``, ``imir``): pillow-heif applies it as it
  opens the file and clears the EXIF entry, Pillow's AVIF reader states it as the EXIF
  entry, so it is applied once and an EXIF entry alone (information only in HEIF) never
  (``tests/runtime/data/test_heif_photos.py``). A video
  of non-square pixels (its sample aspect ratio) is shown in square pixels, and a
  16-bit greyscale image by the high byte of its levels (a 32-bit integer or float
  image, which states no range of its levels, is refused).
- A file either library fails on is a :class:`MediaError` saying why (for HEIC/HEIF
  and AVIF, which Pillow reads through a plugin, the plugin to install when it is
  missing; for a picture past Pillow's decompression-bomb limit, its pixels and
  the fix; one under it is read without Pillow's warning).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.data.media_animation import (
    animation_times,
    clear_canvas,
    gif_starts,
    hidden_frames,
    load_frame,
)
from datacentric.data.media_colours import (
    colour_problem,
    image_rgb,
    mapping_problem,
    rgb_picture,
)
from datacentric.data.media_sources import MediaItem
from datacentric.progress import counted

#: The revision of what :func:`probe` and :func:`decode` make of a file: bump when what a
#: file decodes to changes (its frames, their size, pixels or colours). ``prepare``
#: records it with each clip it encodes and encodes again, on a resume, the clips an
#: earlier reading encoded. 1: upright by EXIF and display rotation, square pixels, MP4
#: edit lists, the shown stream, colours by matrix and range, HDR mapped to BT.709, ICC
#: profiles, 16-bit greyscale; 2: an APNG's frames as browsers compose them (a frame
#: after one disposed to the frame before it; a half-transparent frame blended by its
#: alpha; no still outside the animation); 3: an interlaced clip's frames deinterlaced as
#: players show them (:func:`_deinterlaced`) (0: the records of earlier versions, which
#: state none).
READING_REVISION = 3
#: images Pillow reads only through a plugin: suffix -> (its module, how to install it)
IMAGE_PLUGINS = {
    ".heic": ("pillow_heif", "pip install pillow-heif"),
    ".heif": ("pillow_heif", "pip install pillow-heif"),
    ".avif": (
        "pillow_avif",
        "Pillow 11.3 or later built with libavif, or pip install pillow-avif-plugin",
    ),
}
IMAGE_PLUGINS[".avifs"] = IMAGE_PLUGINS[".avif"]  # an AVIF image sequence
#: Pillow's formats whose files may hold an animation: several frames are a clip (an
#: AVIF image sequence's too; a HEIF file's several pictures are a burst or a bracket)
ANIMATED_FORMATS = ("WEBP", "PNG", "AVIF")


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
    other than upright); :func:`decode` returns them upright."""
    times: tuple[Any, ...] | None = field(default=None, compare=False)
    """Every frame's timestamp in seconds (``Fraction`` where the stream has them), in
    presentation order: only when :func:`probe` is asked for them."""


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
        return Image.open(path)


def _unreadable_image(path: Path, err: Exception) -> MediaError:
    """The reason an image is skipped: Pillow's words, and the plugin it lacks; for one
    past Pillow's decompression-bomb limit, its pixels and the fix."""
    from PIL import Image

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
    """Why an image's levels cannot be shown as 8-bit RGB, or None: a 32-bit integer or
    float image (Pillow's ``I`` or ``F``) states no range its levels span."""
    if image.mode in ("I", "F") and not _sixteen_bit(image):
        kind = "floating-point" if image.mode == "F" else "32-bit integer"
        return (
            f"a {kind} image (Pillow mode {image.mode}) states no range of its levels: "
            "save it with 8 or 16 bits a level (PNG, TIFF)"
        )
    return None


def _rgb(image: Any, sixteen: bool) -> Any:
    """An RGB image of ``image``: in sRGB by its colour profile
    (:func:`~datacentric.data.media_colours.image_rgb`); 16-bit levels by their high
    byte, as Pillow reads a 16-bit RGB PNG (its ``convert("RGB")`` clips them at 255
    instead: nearly all white)."""
    from PIL import Image

    if not sixteen:
        return image_rgb(image)
    levels = np.asarray(image).astype(np.uint32) >> 8
    return Image.fromarray(levels.astype(np.uint8), "L").convert("RGB")


def _image_orientation(image: Any) -> int:
    """The EXIF orientation tag of a Pillow image (1, upright, when it has none)."""
    try:
        return int(image.getexif().get(0x0112, 1) or 1)
    except Exception:  # noqa: BLE001 - an unreadable EXIF block is no orientation
        return 1


def _stored_size(image: Any) -> tuple[int, int]:
    """The height and width of an image's pixels as stored, before its EXIF orientation:
    Pillow's size, but a TIFF's from its own ImageLength and ImageWidth tags: Pillow 13
    reports a TIFF's size turned by its orientation already (it turns it as it loads)."""
    tags = getattr(image, "tag_v2", None)
    if image.format == "TIFF" and tags is not None and 256 in tags and 257 in tags:
        return int(tags[257]), int(tags[256])
    return image.height, image.width


def _display_matrix(frame: Any) -> list[int] | None:
    """The 3 x 3 display matrix of a decoded frame (FFmpeg's ``int32`` layout), or None."""
    for data in getattr(frame, "side_data", None) or ():
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


def _frame_time(frame: Any, number: int, stream: Any) -> Any:
    """A decoded frame's timestamp in seconds: exact (``Fraction``) from its ``pts``, or
    its number over the stream's frame rate when it has none."""
    if frame.pts is not None and frame.time_base is not None:
        return frame.pts * frame.time_base
    rate = stream.average_rate or stream.guessed_rate or 1
    return Fraction(number) / Fraction(rate)


#: FFmpeg's stream dispositions read here (``AV_DISPOSITION_*``)
DEFAULT_STREAM, COVER_PICTURE = 0x1, 0x400


def _disposition(stream: Any) -> int:
    """A stream's FFmpeg disposition flags (0 where this PyAV reads none; PyAV 16 and 17
    give a ``Flag`` of no ``int()``)."""
    flags = getattr(stream, "disposition", 0)
    return int(getattr(flags, "value", flags) or 0)


def _shown_stream(streams: Any) -> Any:
    """The video stream a player opens of a file's: the first marked the default (as
    FFmpeg's own choice, ``av_find_best_stream``, prefers it), else the first; never a
    cover picture (an audio file's artwork: one still, no clip); None when there is
    no other."""
    moving = [s for s in streams if not _disposition(s) & COVER_PICTURE]
    if not moving:
        return None
    return next((s for s in moving if _disposition(s) & DEFAULT_STREAM), moving[0])


def _picture(frame: Any, reformatter: Any) -> Any:
    """A decoded frame as RGB as players show it (:func:`~datacentric.data.media_colours.
    rgb_picture`); :class:`MediaError` when the installed PyAV cannot show its colours."""
    picture = rgb_picture(frame, reformatter)
    if isinstance(picture, str):
        raise MediaError(picture)
    return picture


def _open_video(path: Path) -> Any:
    """A PyAV container and the video stream it shows (:func:`_shown_stream`; audio and
    other streams, wherever they sit, are never decoded); :class:`MediaError` when there
    is no video stream but a cover picture, or the installed PyAV would not show its
    colours (:func:`~datacentric.data.media_colours.colour_problem`)."""
    import av

    problem = colour_problem(str(av.__version__))
    if problem:
        raise MediaError(problem)
    container = av.open(str(path))
    stream = _shown_stream(container.streams.video)
    if stream is None:
        kinds = sorted({s.type for s in container.streams if s.type != "video"}) or ["no"]
        cover = " and a cover picture" if container.streams.video else ""
        container.close()
        raise MediaError(f"no video stream ({', '.join(kinds)} streams{cover} only)")
    stream.thread_type = "AUTO"
    return container, stream


class _Frames:
    """The decoded frames of a video stream as players show them, in presentation
    order. A stream cut before its first keyframe (a clip cut from a longer one without
    re-encoding) plays from that keyframe: the packets before its first frame that the
    decoder refuses (VP9 does; H.264 drops their frames itself) are passed over, as
    players pass them; any other refusal is the file's error."""

    def __init__(self, container: Any, stream: Any) -> None:
        self.container, self.stream = container, stream
        self.cut = False
        """The stream's first packet is no keyframe: the frames its container states
        count frames before the first keyframe, which never show."""

    def __iter__(self) -> Iterator[Any]:
        import av

        opened, shown = False, False  # the first packet seen; a frame decoded
        for packet in self.container.demux(self.stream):
            if not opened and packet.size:
                opened, self.cut = True, not packet.is_keyframe
            try:
                for frame in packet.decode():
                    shown = True
                    yield frame
            except av.error.FFmpegError:
                if shown or not self.cut:
                    raise


#: a stream's field orders that are interlaced (FFmpeg's ``AVFieldOrder``: TT, BB, TB, BT)
INTERLACED_ORDERS = (2, 3, 4, 5)
#: FFmpeg's deinterlacer, as players show an interlaced clip: one frame per frame, at the
#: clip's rate, by its field order; only frames that say they are interlaced
DEINTERLACER = ("bwdif", "mode=send_frame:parity=auto:deint=interlaced")


def _pulled(graph: Any) -> Iterator[Any]:
    """The frames a filter graph holds ready."""
    import av

    while True:
        try:
            yield graph.vpull()
        except (av.BlockingIOError, av.EOFError):
            return


def _deinterlaced(frames: Iterator[Any], stream: Any) -> Iterator[Any]:
    """A stream's decoded frames as players show them: an interlaced clip's (its field
    order, or its first frame, says so) through FFmpeg's deinterlacer
    (:data:`DEINTERLACER`), the same frames at the same times with each field's lines
    filled from its own instant, not two instants woven into combs; a progressive
    clip's as decoded."""
    import av.filter

    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        return
    order = int(getattr(stream.codec_context, "field_order", 0) or 0)
    if not first.interlaced_frame and order not in INTERLACED_ORDERS:
        yield first
        yield from frames
        return
    graph = av.filter.Graph()
    source = graph.add_buffer(
        width=first.width,
        height=first.height,
        format=first.format,
        time_base=first.time_base or stream.time_base,
    )
    deinterlacer, sink = graph.add(*DEINTERLACER), graph.add("buffersink")
    source.link_to(deinterlacer)
    deinterlacer.link_to(sink)
    graph.configure()
    for frame in itertools.chain([first], frames):
        graph.vpush(frame)
        yield from _pulled(graph)
    graph.vpush(None)
    yield from _pulled(graph)


def _animation_frames(image: Any) -> int:
    """The frames of an image file: an animated WebP's, PNG's (APNG) or AVIF's all, else
    1 (an MPO photo's second picture, a depth map or preview, is no frame of a clip)."""
    if image.format not in ANIMATED_FORMATS:
        return 1
    return int(getattr(image, "n_frames", 1)) - hidden_frames(image)


def _probe_image(path: Path, times: bool) -> MediaInfo:
    """:func:`probe` of an image file: one frame, or an animation's frames."""
    try:
        with _open_image(path) as image:
            orientation = _image_orientation(image)
            h, w = _stored_size(image)
            problem = _level_problem(image)
            frames = _animation_frames(image)
            stamps = animation_times(image, frames) if times and frames > 1 else None
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
        raise _unreadable_image(path, err) from None
    if problem:
        raise MediaError(problem)
    turned = orientation in (5, 6, 7, 8)
    return MediaInfo(frames, w if turned else h, h if turned else w, orientation != 1, stamps)


def _pictures(image: Any, order: list[int], hidden: int, sixteen: bool) -> list[Any]:
    """The upright RGB pictures (:func:`_rgb`) of an image file's frames at ``order``
    (after ``hidden`` frames that are none: :mod:`~datacentric.data.media_animation`'s
    ``hidden_frames``). An APNG's are read through every frame before them, each
    composed by its ``load_frame`` (Pillow composes a frame it passes over itself),
    from a clear canvas (``clear_canvas``); another file's are sought directly."""
    from PIL import ImageOps

    wanted, pictures = set(order), {}
    steps = range(max(order) + 1) if image.format == "PNG" else sorted(wanted)
    for number in steps:
        image.seek(number + hidden)
        if hidden and number == 0:
            clear_canvas(image)
        load_frame(image)
        if number in wanted:
            pictures[number] = _rgb(ImageOps.exif_transpose(image), sixteen)
    return [pictures[number] for number in order]


def _decode_image(path: Path, indices: list[int] | None) -> list[Any]:
    """:func:`decode` of an image file: its frame (0), or an animation's at ``indices``."""
    try:
        with _open_image(path) as image:
            problem, sixteen = _level_problem(image), _sixteen_bit(image)
            frames, hidden = _animation_frames(image), hidden_frames(image)
            order = list(range(frames)) if indices is None else indices
            if not problem and all(0 <= i < frames for i in order):
                return _pictures(image, order, hidden, sixteen) if order else []
    except Exception as err:  # noqa: BLE001
        raise _unreadable_image(path, err) from None
    raise MediaError(problem or f"{counted(frames, 'frame')}, frame {max(order)} wanted")


#: containers whose stated frame count is their frame slots, not their pictures: an
#: AVI's header counts every slot of its frame rate, a picture held over a gap (a
#: dropped frame, a variable rate) counted again
SLOT_COUNTS = ("avi",)


def _demuxed_pictures(container: Any, stream: Any) -> int:
    """The pictures of a slot-counting stream (:data:`SLOT_COUNTS`) told without decoding
    them: its packets that hold data, for an intra-only codec (MJPEG, DV, raw, HuffYUV,
    Ut Video, ProRes), where each such packet is one picture; 0 (decode them to count)
    for another: an MPEG-4 Part 2 packet (Xvid, DivX) may hold a VOP "not coded" (a
    dropped frame, 6 bytes), which decodes to no frame, and an H.264 one a lone field."""
    import av

    if not getattr(stream.codec_context.codec, "intra_only", False):
        return 0
    with av.open(container.name) as again:
        packets = again.demux(again.streams[stream.index])
        return sum(1 for packet in packets if packet.size)


def _stated_frames(stream: Any, container: Any) -> int:
    """The frames a video stream's container states, where they are the frames that play;
    0 (count them as they decode) where it states none, where it counts frame slots
    (:data:`SLOT_COUNTS`) of a codec whose packets do not tell its pictures
    (:func:`_demuxed_pictures`), or more than its duration holds at its frame rate: an
    MP4 or MOV cut without re-encoding, whose edit list trims frames that FFmpeg (and
    every player) then never shows."""
    if str(getattr(container.format, "name", "")) in SLOT_COUNTS:
        return _demuxed_pictures(container, stream)
    stated = int(stream.frames or 0)
    duration, base, rate = stream.duration, stream.time_base, stream.average_rate
    if stated and duration and base and rate and stated > round(duration * base * rate):
        return 0
    return stated


def probe(item: MediaItem, *, times: bool = False) -> MediaInfo:
    """Frames and upright size of a file; :class:`MediaError` when it cannot be read.

    A video's frame count is the stream's own when its container states one (MP4, MOV,
    GIF), else the frames that decode (Matroska and WebM keep no per-stream count; an
    AVI counts frame slots, its packets tell an intra-only codec's pictures; an edit
    list that trims frames: :func:`_stated_frames`);
    its size and rotation are those of its first decoded frame. With ``times``, every
    frame is decoded: the count is theirs and :attr:`MediaInfo.times` their timestamps."""
    if not item.path.is_file():
        raise MediaError("missing: no such file")
    if item.is_image:
        return _probe_image(item.path, times)
    try:
        container, stream = _open_video(item.path)
        with container:
            stated = 0 if times else _stated_frames(stream, container)
            first, decoded, stamps = None, 0, []
            frames = _Frames(container, stream)
            for frame in frames:
                first = frame if first is None else first
                decoded += 1
                stated = 0 if frames.cut else stated
                if times:
                    stamps.append(_frame_time(frame, decoded - 1, stream))
                if stated:
                    break
            if first is None:
                raise MediaError("no frame decodes (an empty or unreadable video stream)")
            if times and str(getattr(container.format, "name", "")) == "gif":
                stamps = gif_starts(stamps)
            problem = mapping_problem(first)  # refused when planned, not when encoded
            if problem:
                raise MediaError(problem)
            turns, aspect = _display_turns(first, stream), _pixel_aspect(stream)
    except MediaError:
        raise
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt or unreadable video ({type(err).__name__}: {err})") from None
    h, w = first.height, _square_width(first.width, aspect)
    if {"TRANSPOSE", "TRANSVERSE", "ROTATE_90", "ROTATE_270"} & set(turns):
        h, w = w, h
    return MediaInfo(stated or decoded, h, w, bool(turns), tuple(stamps) if times else None)


def decode(item: MediaItem, indices: list[int] | None = None) -> list[Any]:
    """The upright RGB frames (``PIL.Image``) of ``item`` at ``indices`` (every frame if
    None): an image turned by its EXIF orientation (as ``ImageOps.exif_transpose`` and
    diffusers' ``load_image``), a video's frames by their display rotation;
    :class:`MediaError` when decoding fails or the clip is shorter than asked."""
    if item.is_image:
        return _decode_image(item.path, indices)
    wanted = None if indices is None else set(indices)
    frames: dict[int, Any] = {}
    decoded = 0
    try:
        from av.video.reformatter import VideoReformatter

        container, stream = _open_video(item.path)
        with container:
            aspect = _pixel_aspect(stream)  # the stream's, read once
            reformatter = VideoReformatter()  # one for the clip: its scaler's map kept
            for frame in _deinterlaced(_Frames(container, stream), stream):
                if wanted is None or decoded in wanted:
                    image = _square_pixels(_picture(frame, reformatter), aspect)
                    frames[decoded] = _upright(image, _display_turns(frame, stream))
                decoded += 1
                if wanted is not None and len(frames) == len(wanted):
                    break
    except MediaError:
        raise
    except Exception as err:  # noqa: BLE001 - any decoder failure is a bad file
        raise MediaError(f"corrupt video ({type(err).__name__}: {err})") from None
    order = sorted(frames) if indices is None else indices
    if not order or any(i not in frames for i in order):
        wants = max(order) + 1 if order else 1
        raise MediaError(
            f"only {decoded} frames decode, {wants} wanted (a truncated or damaged stream)"
        )
    return [frames[i] for i in order]
