"""A HEIC of several top-level pictures (a burst, an edited photo kept with its original)
is read as every viewer shows it: its primary picture, the one its ``pitm`` box names,
which need not be the first it lists. ``probe`` and ``decode`` agree on it: its size, its
turn (``irot``), its colours (``nclx``) and, for a 10-bit HLG photo, its 10-bit levels;
the file is one picture, the others are not read. Each HEIC is written here with
pillow-heif, lossless, its primary named by ``primary_index``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from media_formats import wave_frames, write_nclx_heic, write_ten_bit_heic

from datacentric.data.media_boxes import container_turned, nclx_box
from datacentric.data.media_decode import decode, probe
from datacentric.data.media_sources import MediaItem

#: pillow-heif's options for a lossless HEIC: x265 lossless, RGB coded as is
LOSSLESS = {"quality": -1, "chroma": 444, "matrix_coefficients": 0}
#: EXIF's Orientation tag, which pillow-heif writes as the container's ``irot`` turn
ORIENTATION_TAG = 0x0112
#: the nclx colours of BT.2020 HLG photos
HLG = {"color_primaries": 9, "transfer_characteristics": 18}


def _item(path: Path) -> MediaItem:
    return MediaItem(0, path, path.name, "a cat", path.name)


def _picture(seed: int, height: int, width: int) -> np.ndarray:
    """Waves of ``seed``'s colours with a white corner top-left (no turn leaves it so)."""
    pixels = wave_frames(1, height, width, seed)[0]
    pixels[: height // 4, : width // 4] = 255
    return pixels


def _write_heic(path: Path, pictures: list[tuple[np.ndarray, dict]], primary: int) -> Path:
    """A lossless HEIC of top-level ``pictures`` in this order (levels, and the options
    pillow-heif writes each with: its nclx colours, its EXIF) whose ``pitm`` box names
    the one at ``primary``. A ``uint16`` array is written as 10-bit levels (0 to 1023),
    one of ``H x W`` as greyscale."""
    import pillow_heif

    heif = pillow_heif.HeifFile()
    for levels, options in pictures:
        height, width = levels.shape[:2]
        if levels.dtype == np.uint16:
            mode = "L;16" if levels.ndim == 2 else "RGB;16"
            data = (levels.astype("<u2") << 6).tobytes()  # pillow-heif takes 16-bit levels
        else:
            mode, data = "RGB", levels.tobytes()
        heif.add_frombytes(mode, (width, height), data).info.update(LOSSLESS, **options)
    heif.save(path, primary_index=primary, **LOSSLESS)
    read = pillow_heif.open_heif(path)
    assert [image.info["primary"] for image in read] == [i == primary for i in range(len(read))]
    return path


@pytest.mark.parametrize("primary", [1, 2])
def test_the_primary_picture_of_several_is_read_not_the_first(tmp_path, primary):
    """Three pictures of other sizes and colours, the second or third primary: probe gives
    the primary's size, decode its pixels, exactly. The first was decoded (48 x 32)
    while probe gave the primary's size."""
    pytest.importorskip("pillow_heif")
    stored = [_picture(0, 32, 48), _picture(1, 40, 24), _picture(2, 16, 64)]
    path = _write_heic(tmp_path / "burst.heic", [(p, {}) for p in stored], primary)
    info = probe(_item(path))
    assert (info.frames, info.height, info.width) == (1, *stored[primary].shape[:2])
    assert not info.rotated
    (got,) = decode(_item(path))
    assert np.array_equal(np.asarray(got), stored[primary])


def test_the_primary_picture_is_turned_by_its_own_container_turn(tmp_path):
    """The primary alone turned by its container (``irot``, a quarter turn): probe counts
    it turned and gives its upright size; decode gives it upright, turned once."""
    from PIL import Image

    pytest.importorskip("pillow_heif")
    tags = Image.Exif()
    tags[ORIENTATION_TAG] = 6  # pillow-heif states it as irot: a quarter turn clockwise
    first, turned = _picture(0, 32, 48), _picture(1, 40, 24)
    pictures = [(first, {}), (turned, {"exif": tags.tobytes()})]
    path = _write_heic(tmp_path / "turned.heic", pictures, 1)
    assert container_turned(path)
    info = probe(_item(path))
    assert (info.height, info.width, info.rotated) == (24, 40, True)
    (got,) = decode(_item(path))
    assert np.array_equal(np.asarray(got), np.rot90(turned, k=-1))


def test_the_primary_picture_is_converted_by_its_own_colours(tmp_path):
    """The same pixels twice, stated sRGB (first) and Display P3 (primary) by their nclx
    boxes: decode converts them from Display P3, as the same pixels in a HEIC of the
    primary alone. They were read as stored (sRGB, the first picture's colours)."""
    pytest.importorskip("pillow_heif")
    stored = _picture(0, 24, 40)
    srgb = {"color_primaries": 1, "transfer_characteristics": 13}
    p3 = {"color_primaries": 12, "transfer_characteristics": 13}
    path = _write_heic(tmp_path / "edited.heic", [(stored, srgb), (stored, p3)], 1)
    assert nclx_box(path)["color_primaries"] == 12
    (alone,) = decode(_item(write_nclx_heic(tmp_path / "alone.heic", stored, 12, 13)))
    assert not np.array_equal(np.asarray(alone), stored)  # the conversion shows
    (got,) = decode(_item(path))
    assert np.array_equal(np.asarray(got), np.asarray(alone))


@pytest.mark.parametrize("grey", [False, True])
def test_the_primary_ten_bit_hlg_picture_is_mapped_from_its_own_levels(tmp_path, grey):
    """Two 10-bit HLG pictures (RGB, or greyscale), a ramp of every level (primary) after
    the same ramp run backwards: decode maps the primary's 10 bits, as a HEIC of the ramp
    alone is mapped. The first picture's levels were mapped (the ramp backwards)."""
    from datacentric.data.media_colours import maps_to_bt709

    pytest.importorskip("pillow_heif")
    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR (the refusal's test)")
    ramp = np.tile(np.arange(1024, dtype=np.uint16), (4, 1))
    levels = ramp if grey else np.stack([ramp] * 3, -1)
    backwards = levels[:, ::-1].copy()
    path = _write_heic(tmp_path / "hdr.heic", [(backwards, HLG), (levels, HLG)], 1)
    (alone,) = decode(_item(write_ten_bit_heic(tmp_path / "alone.heic", levels, **HLG)))
    (got,) = decode(_item(path))
    assert np.array_equal(np.asarray(got), np.asarray(alone))
    assert (np.diff(np.asarray(got, dtype=int)[0, :, 1]) >= 0).all()
