"""prepare's frame sampling as plain data: the target-fps rule, strides, windows."""

from __future__ import annotations

from fractions import Fraction

import pytest

from datacentric.data.base import DataError
from datacentric.data.clip_plans import plan_clip
from datacentric.data.frame_sampling import FrameSampling, frame_line, window_positions
from datacentric.data.media_decode import MediaInfo
from datacentric.data.video_geometry import Geometry

WAN = Geometry(temporal=4, multiple=16)


def _nearest(times: list[Fraction], fps: int) -> list[int]:
    """Output frame i: the frame whose time is nearest i / fps after the first (a tie:
    the earlier), by looking at every frame."""
    span, out, i = times[-1] - times[0], [], 0
    while Fraction(i, fps) <= span:
        goal = times[0] + Fraction(i, fps)
        out.append(min(range(len(times)), key=lambda j: (abs(times[j] - goal), j)))
        i += 1
    return out


def test_target_fps_keeps_the_frame_nearest_each_output_time():
    thirty = [Fraction(k, 30) + Fraction(1, 7) for k in range(45)]  # 30 fps, offset start
    line = frame_line(45, thirty, FrameSampling(target_fps=16))
    assert line == _nearest(thirty, 16) and len(line) == 24
    assert line[:6] == [0, 2, 4, 6, 7, 9]  # 0.25 s lies between frames 7 and 8: the earlier
    twelve = [Fraction(k, 12) for k in range(10)]  # up-sampled: frames repeat
    assert frame_line(10, twelve, FrameSampling(target_fps=24)) == _nearest(twelve, 24)
    assert frame_line(10, None, FrameSampling(frame_stride=3)) == [0, 3, 6, 9]
    both = FrameSampling(target_fps=16, frame_stride=2)
    assert frame_line(45, thirty, both) == _nearest(thirty, 16)[::2]


def test_windows_of_each_extraction():
    assert window_positions(30, 9, FrameSampling(), "head") == [tuple(range(9))]
    assert window_positions(30, 5, FrameSampling(frame_extraction="uniform"), "head") == [
        (0, 7, 14, 22, 29)
    ]
    slide = FrameSampling(frame_extraction="slide", windows=3)
    assert [w[0] for w in window_positions(29, 9, slide, "head")] == [0, 10, 20]
    strided = FrameSampling(frame_extraction="slide", windows=5, window_stride=8)
    assert [w[0] for w in window_positions(29, 9, strided, "head")] == [0, 8, 16]
    chunk = FrameSampling(frame_extraction="chunk")
    assert [(w[0], w[-1]) for w in window_positions(30, 9, chunk, "head")] == [
        (0, 8),
        (9, 17),
        (18, 26),
    ]
    assert len(window_positions(30, 9, FrameSampling(frame_extraction="chunk", windows=2), "")) == 2


def test_a_plan_takes_its_frames_from_the_sampled_line():
    info = MediaInfo(60, 32, 32)
    sampling = FrameSampling(frame_stride=2, max_frames=10, frame_extraction="chunk")
    plan = plan_clip(info, WAN, is_image=False, sampling=sampling)
    assert plan.windows == (
        tuple(range(0, 18, 2)),
        tuple(range(18, 36, 2)),
        tuple(range(36, 54, 2)),
    )
    assert plan.cost == 27 * 32 * 32
    short = plan_clip(
        MediaInfo(9, 32, 32), WAN, is_image=False, sampling=FrameSampling(frame_stride=3)
    )
    assert short == "too short: 3 frames after --target-fps/--frame-stride, the VAE needs 5"
    image = plan_clip(MediaInfo(1, 32, 32), WAN, is_image=True, sampling=sampling)
    assert image.windows == ((0,),)


def test_sampling_flags_out_of_range_name_the_flag():
    for bad, flag in (
        ({"frame_stride": 0}, "--frame-stride 0"),
        ({"max_frames": 0}, "--max-frames 0"),
        ({"target_fps": -1.0}, "--target-fps -1.0"),
        ({"frame_extraction": "all"}, "--frame-extraction 'all'"),
        ({"windows": 2}, "--windows and --window-stride take"),
        ({"frame_extraction": "chunk", "window_stride": 2}, "--window-stride takes"),
    ):
        with pytest.raises(DataError, match=flag):
            FrameSampling(**bad)
