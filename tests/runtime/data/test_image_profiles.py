"""A picture's colours reach ``prepare`` as viewers show them: converted to sRGB by the
ICC profile it embeds (a still, an animation's frames, a photo turned by EXIF, a 16-bit
greyscale picture), a damaged or unfitting profile passed over, and an sRGB-tagged photo
read as stored without a conversion."""

from __future__ import annotations

import numpy as np
import pytest
from fidelity_clips import _error, _item
from media_formats import gamma_curve, grey_profile, rgb_profile, srgb_curve, wave_frames

from datacentric.data.media_decode import decode, probe

pytest.importorskip("av")


def _linear_light_profile() -> bytes:
    """A profile of sRGB's colorants (LittleCMS's own) and a gamma of 1 (linear light): a
    picture tagged with it holds light, not sRGB's levels, and viewers show level 128 as
    sRGB's 188."""
    import struct

    return rgb_profile(b"curv\0\0\0\0" + struct.pack(">IH", 1, 256) + b"\0\0")  # gamma 1.0


def _camera_srgb_profile() -> bytes:
    """An sRGB profile laid out as the one cameras and editors embed ('sRGB
    IEC61966-2.1'): sRGB's curve in a table of 1024 entries, colorants to 4 decimals."""
    colorants = [(0.4361, 0.2225, 0.0139), (0.3851, 0.7169, 0.0971), (0.1431, 0.0606, 0.7141)]
    return rgb_profile(srgb_curve(), colorants)


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".tiff", ".webp"])
def test_a_picture_with_a_colour_profile_is_shown_as_viewers_show_it(tmp_path, suffix):
    """A still, and an animated PNG's or WebP's frames, tagged with an ICC profile other
    than sRGB's are converted to sRGB by it, as viewers show them: a linear-light
    picture's levels come out sRGB-encoded (128 as 188). Its levels were taken as
    sRGB's: 51.7 levels off on average for this ramp."""
    from PIL import Image

    ramp = np.tile(np.linspace(0, 255, 48).round().astype(np.uint8), (32, 1))
    stored = np.stack([ramp, ramp[::-1], np.full_like(ramp, 128)], -1)
    path = tmp_path / f"linear{suffix}"
    options = {".jpg": {"quality": 100}, ".webp": {"lossless": True}}.get(suffix, {})
    Image.fromarray(stored).save(path, icc_profile=_linear_light_profile(), **options)
    light = stored / 255.0  # the sRGB encoding of linear light, by its formula
    want = np.where(light <= 0.0031308, 12.92 * light, 1.055 * light ** (1 / 2.4) - 0.055) * 255
    (got,) = decode(_item(path))
    tolerance = 3 if suffix == ".jpg" else 1  # JPEG's loss at quality 100
    assert _error(got, np.round(want)) < tolerance, (suffix, _error(got, stored))
    if suffix in (".png", ".webp"):  # an animation's frames: 64, 128, 192 as 137, 188, 225
        frames = [Image.fromarray(np.full((8, 8, 3), v, np.uint8)) for v in (64, 128, 192)]
        path = tmp_path / f"animated{suffix}"
        profile = _linear_light_profile()
        frames[0].save(path, save_all=True, append_images=frames[1:], icc_profile=profile)
        assert [np.asarray(f)[0, 0, 0] for f in decode(_item(path))] == [137, 188, 225]


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_a_photo_turned_by_exif_with_a_colour_profile_is_turned_and_converted(tmp_path, suffix):
    """A phone's portrait photo (EXIF orientation 6: turned 90 degrees clockwise to be
    shown) that also embeds a colour profile is shown upright and converted by it
    (regression case): the two are applied together, against numpy's turn and the
    sRGB encoding of linear light by its formula."""
    from PIL import Image

    ramp = np.tile(np.linspace(0, 255, 48).round().astype(np.uint8), (32, 1))
    stored = np.stack([ramp, ramp[::-1], np.full_like(ramp, 128)], -1)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / f"portrait{suffix}"
    options = {".jpg": {"quality": 100}}.get(suffix, {})
    Image.fromarray(stored).save(path, exif=exif, icc_profile=_linear_light_profile(), **options)
    light = np.rot90(stored, k=-1) / 255.0
    want = np.where(light <= 0.0031308, 12.92 * light, 1.055 * light ** (1 / 2.4) - 0.055) * 255
    info = probe(_item(path))
    (got,) = decode(_item(path))
    assert (info.height, info.width, info.rotated) == (48, 32, True)
    assert _error(got, np.round(want)) < (3 if suffix == ".jpg" else 1)


def test_a_profile_that_does_not_read_or_fit_is_passed_over_as_viewers_pass_it(tmp_path):
    """A PNG whose ICC profile is damaged, and a greyscale PNG given an RGB profile: their
    levels are shown as sRGB's, as viewers show them (no error, no other colours)."""
    from PIL import Image

    stored = wave_frames(1, 32, 48)[0]
    damaged = _linear_light_profile()[:200]
    Image.fromarray(stored).save(tmp_path / "damaged.png", icc_profile=damaged)
    grey = stored[..., 0]
    Image.fromarray(grey).save(tmp_path / "grey.png", icc_profile=_linear_light_profile())
    (got,) = decode(_item(tmp_path / "damaged.png"))
    assert np.array_equal(np.asarray(got), stored)
    (got,) = decode(_item(tmp_path / "grey.png"))
    assert np.array_equal(np.asarray(got), np.stack([grey] * 3, -1))


def test_a_picture_tagged_srgb_is_read_as_stored_without_a_conversion(tmp_path, monkeypatch):
    """Photos tagged with an sRGB profile (LittleCMS's own, and one laid out as cameras
    write it), as most photos are: read at their levels exactly, and no picture goes
    through LittleCMS (a profile is checked once, on a sample of colours). Each picture
    was converted: about 12 ms a 1024 x 768 photo, 4 times its JPEG decoding."""
    from PIL import Image, ImageCms

    converted = []
    convert = ImageCms.profileToProfile
    monkeypatch.setattr(
        ImageCms,
        "profileToProfile",
        lambda im, *a, **k: converted.append(im.size) or convert(im, *a, **k),
    )
    stored = wave_frames(1, 32, 48)[0]
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    for number in range(4):
        profile = (srgb, _camera_srgb_profile())[number % 2]
        path = tmp_path / f"photo{number}.png"
        Image.fromarray(stored).save(path, icc_profile=profile)
        (got,) = decode(_item(path))
        assert np.array_equal(np.asarray(got), stored), number
    assert (48, 32) not in converted, converted


def test_a_sixteen_bit_grey_picture_is_converted_by_its_profile_as_an_eight_bit_one(tmp_path):
    """A 16-bit greyscale PNG with a greyscale ICC profile (linear light) is shown as the
    same picture at 8 bits with that profile: its levels' high byte, converted. Its
    profile was passed over (level 128 read as 128, where viewers show 188)."""
    from PIL import Image

    ramp = np.tile(np.arange(256, dtype=np.uint16) * 257, (4, 1))
    profile = grey_profile(gamma_curve(1.0))
    Image.fromarray((ramp >> 8).astype(np.uint8)).save(tmp_path / "eight.png", icc_profile=profile)
    Image.fromarray(ramp).save(tmp_path / "deep.png", icc_profile=profile)
    (want,) = decode(_item(tmp_path / "eight.png"))
    assert abs(int(np.asarray(want)[0, 128, 0]) - 188) <= 1  # the profile moves the levels
    (got,) = decode(_item(tmp_path / "deep.png"))
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    assert np.array_equal(np.asarray(got), np.asarray(want))
