"""Phone photos in HEIC (iPhones' own format, read through pillow-heif) and AVIF (read by
Pillow) reach ``prepare`` upright and in their colours: turned once by the transforms
their container states (``irot``, ``imir``), which an EXIF Orientation entry beside them
only repeats (HEIF's rule, as libheif, libavif and browsers read it: EXIF's entry is not
applied again); converted from a Display P3 profile as a PNG with that profile is; 10-bit
levels read as 8-bit ones. Each photo is written here with pillow-heif or Pillow, of an
asymmetric picture (a turn the wrong way or twice shows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from media_formats import display_p3_profile, wave_frames, write_oriented_photo, write_ten_bit_heic

from datacentric.data.media_decode import decode, probe
from datacentric.data.media_sources import MediaItem

#: EXIF's orientations as numpy turns the stored pixels upright: 6, turned 90 degrees
#: clockwise; 3, half a turn; 7, mirrored left-right then turned clockwise
UPRIGHT = {
    6: lambda a: np.rot90(a, k=-1),
    3: lambda a: np.rot90(a, k=2),
    7: lambda a: np.rot90(np.fliplr(a), k=-1),
}
#: where the orientation is stated: the container's transforms, EXIF's entry, or both
STATED = {"container": (True, False), "exif": (False, True), "both": (True, True)}


def _item(path: Path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


def _needs(suffix: str) -> None:
    """Skips where this machine cannot write and read ``suffix`` photos."""
    from PIL import features

    if suffix == ".heic":
        pytest.importorskip("pillow_heif")
    elif not features.check("avif"):
        pytest.skip("this Pillow is built without libavif")


def _stored() -> np.ndarray:
    """64 x 96 waves with a white corner top-left: no turn or mirror leaves it the same."""
    pixels = wave_frames(1, 64, 96)[0]
    pixels[:12, :20] = 255
    return pixels


def _error(got, want) -> float:
    """The largest difference of a decoded picture from ``want``, in levels."""
    got = np.asarray(got, dtype=float)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max())


@pytest.mark.parametrize("stated", list(STATED))
@pytest.mark.parametrize("orientation", list(UPRIGHT))
@pytest.mark.parametrize("suffix", [".heic", ".avif"])
def test_a_phone_photo_is_turned_once_by_its_container(tmp_path, suffix, orientation, stated):
    """A photo turned by its container's transforms, with EXIF's entry saying the same
    (as iPhones write) or without it, is read upright, turned once; one stating its
    orientation in EXIF alone is read as stored, as libheif and browsers show it (HEIF
    reads EXIF's entry as information only). Lossless HEIC within 0 levels, AVIF at
    quality 100 within 6 levels (its loss on these waves: 3 at most, measured)."""
    _needs(suffix)
    container, exif = STATED[stated]
    stored = _stored()
    path = write_oriented_photo(
        tmp_path / f"photo{suffix}", stored, orientation, container=container, exif=exif
    )
    want = UPRIGHT[orientation](stored) if container else stored
    info = probe(_item(path))
    (got,) = decode(_item(path))
    assert (info.frames, info.height, info.width) == (1, *want.shape[:2])
    assert _error(got, want) <= (0 if suffix == ".heic" else 6), (stated, orientation)


@pytest.mark.parametrize("suffix", [".heic", ".avif"])
def test_a_display_p3_photo_is_converted_as_a_png_of_that_profile(tmp_path, suffix):
    """A photo embedding a Display P3 profile (as iPhones' do) is converted to sRGB as a
    PNG with the same profile and pixels is: a lossless HEIC exactly, an AVIF (lossy) within
    1 level on average (0.64 measured); as stored, its levels would be 12.9 off on average."""
    from PIL import Image

    _needs(suffix)
    stored, profile = _stored(), display_p3_profile()
    Image.fromarray(stored).save(tmp_path / "photo.png", icc_profile=profile)
    path = write_oriented_photo(
        tmp_path / f"photo{suffix}", stored, 1, container=False, exif=False, icc_profile=profile
    )
    (want,) = decode(_item(tmp_path / "photo.png"))
    want = np.asarray(want, dtype=float)
    (got,) = decode(_item(path))
    assert np.abs(want - stored).mean() > 10  # the profile moves these colours
    if suffix == ".heic":
        assert _error(got, want) == 0
    else:
        assert np.abs(np.asarray(got, dtype=float) - want).mean() < 1


def test_a_ten_bit_heic_is_read_in_eight_bit_levels(tmp_path):
    """A 10-bit HEIC (iPhones' HDR photos, cameras' HEIF) reads as 8-bit RGB with its
    levels' range: 1023 is white, 512 mid-grey, each level within one of ``L * 255 / 1023``
    (as a 10-bit level shown on an 8-bit display)."""
    pytest.importorskip("pillow_heif")
    ramp = np.tile(np.linspace(0, 1023, 96).round().astype(np.uint16), (64, 1))
    levels = np.stack([ramp, ramp[:, ::-1], np.full_like(ramp, 512)], -1)
    path = write_ten_bit_heic(tmp_path / "ten.heic", levels)
    (got,) = decode(_item(path))
    assert got.mode == "RGB"
    assert _error(got, levels.astype(float) * 255 / 1023) <= 1
    assert tuple(np.asarray(got)[0, -1]) == (255, 0, 128)
