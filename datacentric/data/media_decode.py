"""How ``datacentric prepare`` reads a clip or image listed by
:mod:`datacentric.data.media_sources`: its frames and upright size (:func:`probe`) and
its frames as RGB pictures (:func:`decode`), the same as players and viewers show them.

- Videos are read with PyAV (``av``, in the ``video`` extra), images with Pillow; both
  give RGB :class:`PIL.Image.Image` frames. Every container and codec the installed
  PyAV decodes is read (MP4, MOV, MKV, WebM, AVI, GIF, 3GP, MPEG program and transport
  streams, ASF/WMV, FLV, Ogg, MXF, YUV4MPEG, IVF; H.264, H.265, VP8, VP9, AV1,
  MPEG-1/2/4, WMV, FFV1 as its FFmpeg has them), from the stream players open, a clip
  cut before its first keyframe from that keyframe and an interlaced one deinterlaced
  (:mod:`datacentric.data.media_streams`); its frame count is its stream's when the
  container states the frames that play, else its packets' where they tell the frames
  that show, else the frames that decode (:mod:`datacentric.data.media_frame_counts`).
- An image file is read by :mod:`datacentric.data.media_images` (Pillow and its
  plugins, EXIF orientation, 16-bit greyscale levels); an animated WebP, PNG (APNG) or
  AVIF is a clip of its frames, timed by their durations (one of 10 ms or less, a
  GIF's too, shown 100 ms, as browsers show it: :mod:`datacentric.data.media_animation`).
- Colours are the file's, as players show them on an ordinary display
  (:mod:`datacentric.data.media_colours`): each frame is converted to RGB by the colour
  matrix and range it states (PyAV 17 or later, which reads them; an earlier PyAV is
  named as the reason no clip is read; a frame stating none by the one players guess
  from its size), and an HDR (PQ, HLG) or BT.2020 frame is mapped to BT.709; an image
  is converted to sRGB by the ICC profile it embeds. Levels of more than 8 bits (10-,
  12-bit) are scaled to 8; a clip's alpha channel is dropped, its colours kept as
  stored (not composited over a background); a GIF's transparent pixels are white, as
  FFmpeg's GIF decoder gives them.
- Pixels come upright: an image's EXIF orientation and a video's display rotation are
  applied before sizes are planned and frames resized, and a video of non-square
  pixels (its sample aspect ratio) is shown in square pixels
  (:mod:`datacentric.data.media_display`).
- A file either library fails on is a :class:`MediaError` saying why
  (:mod:`datacentric.data.media_info`, with :class:`MediaInfo`).

The names these modules define that were defined here before are given from here too
(:data:`__all__`).
"""

from __future__ import annotations

from typing import Any

from datacentric.data.media_animation import gif_starts
from datacentric.data.media_colours import mapping_problem
from datacentric.data.media_display import (
    _display_turns,
    _picture,
    _pixel_aspect,
    _square_pixels,
    _square_width,
    _upright,
)
from datacentric.data.media_frame_counts import _frame_time, _stated_frames
from datacentric.data.media_images import (
    ANIMATED_FORMATS,
    IMAGE_PLUGINS,
    _decode_image,
    _image_plugin,
    _probe_image,
)
from datacentric.data.media_info import MediaError, MediaInfo
from datacentric.data.media_sources import MediaItem
from datacentric.data.media_streams import (
    COVER_PICTURE,
    DEFAULT_STREAM,
    _deinterlaced,
    _Frames,
    _open_video,
    _shown_stream,
)

__all__ = [
    # defined here: the entry points and what their reading's revision is
    "READING_REVISION",
    "decode",
    "probe",
    # given from here, defined beside it
    "ANIMATED_FORMATS",
    "COVER_PICTURE",
    "DEFAULT_STREAM",
    "IMAGE_PLUGINS",
    "MediaError",
    "MediaInfo",
    "_Frames",
    "_image_plugin",
    "_shown_stream",
]

#: The revision of what :func:`probe` and :func:`decode` make of a file: bump when what a
#: file decodes to changes (its frames, their size, pixels or colours). ``prepare``
#: records it with each clip it encodes and encodes again, on a resume, the clips an
#: earlier reading encoded. 1: upright by EXIF and display rotation, square pixels, MP4
#: edit lists, the shown stream, colours by matrix and range, HDR mapped to BT.709, ICC
#: profiles, 16-bit greyscale; 2: an APNG's frames as browsers compose them (a frame
#: after one disposed to the frame before it; a half-transparent frame blended by its
#: alpha; no still outside the animation); 3: an interlaced clip's frames deinterlaced as
#: players show them (:func:`~datacentric.data.media_streams._deinterlaced`); 4: an
#: image's colours stated by its ``nclx`` box alone (a HEIC's) converted to sRGB
#: (:func:`~datacentric.data.media_colours.nclx_rgb`); 5: a 16-bit greyscale image's
#: colours converted by its ICC profile or ``nclx`` box as an 8-bit one's; 6: an AVIF's
#: colours stated by its container's ``nclx`` box converted as a HEIC's
#: (:func:`~datacentric.data.media_boxes.nclx_box`); 7: a 10- or 12-bit HLG or PQ
#: HEIC's levels mapped to sRGB from all their bits, not from 8
#: (:func:`~datacentric.data.media_colours.deep_hdr_rgb`); 8: a HEIF's primary picture,
#: not its first; a Fraps frame that repeats the one before, and a VP8 alt-ref an IVF
#: stores as a frame, counted as no frame, as they decode
#: (:data:`~datacentric.data.media_frame_counts.ONE_PICTURE_CODECS`) (0: the records of
#: earlier versions, which state none).
READING_REVISION = 8


def probe(item: MediaItem, *, times: bool = False) -> MediaInfo:
    """Frames and upright size of a file; :class:`MediaError` when it cannot be read.

    A video's frame count is the stream's own when its container states one (MP4, MOV,
    GIF; an IVF of AV1), else its packets' where they tell the frames that show (VP8,
    VP9, FFV1 and the codecs of
    :data:`~datacentric.data.media_frame_counts.ONE_PICTURE_CODECS`), else the frames
    that decode (Matroska and WebM keep no per-stream count; an AVI counts frame slots;
    an edit list that trims frames: :func:`~datacentric.data.media_frame_counts._stated_frames`);
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
