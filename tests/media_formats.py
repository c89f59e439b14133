"""Clips in every container and codec ``prepare`` reads, written with PyAV (the decoder's
own library), for the media tests: MKV (FFV1), WebM (VP9, VP8), AVI (MPEG-4), MOV and
MP4 (H.264, the MP4 with an AAC track before its video), GIF; and clips stored
turned or mirrored, with a display matrix."""

from __future__ import annotations

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
) -> Path:
    """A clip at ``path`` in the format :data:`FORMATS` gives its name (H.264 MP4 for
    another name); ``rotation`` (degrees counter-clockwise) and ``hflip`` (a left-right
    mirror after it) are written as the stream's display matrix."""
    import av

    codec, fmt, pix, audio_first = FORMATS.get(path.name, ("libx264", "mp4", "yuv420p", False))
    with av.open(str(path), "w", format=fmt) as container:
        audio = container.add_stream("aac", rate=8000) if audio_first else None
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, pix
        if codec == "libx264":
            stream.options = {"crf": "0", "preset": "ultrafast"}
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
