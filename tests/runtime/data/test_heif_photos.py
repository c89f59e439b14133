"""Phone photos in HEIC (iPhones' own format, read through pillow-heif) and AVIF (read by
Pillow) reach ``prepare`` upright and in their colours: turned once by the transforms
their container states (``irot``, ``imir``), which an EXIF Orientation entry beside them
only repeats (HEIF's rule, as libheif, libavif and browsers read it: EXIF's entry is not
applied again); converted from a Display P3 profile as a PNG with that profile is, and
from colours stated by a HEIC's ``nclx`` box alone as the ICC profile of the same
primaries and transfer; 10-bit levels read as 8-bit ones. Each photo is written here
with pillow-heif or Pillow, of an asymmetric picture (a turn the wrong way or twice
shows)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
from media_formats import (
    NCLX_TWINS,
    display_p3_profile,
    wave_frames,
    write_nclx_heic,
    write_oriented_photo,
    write_ten_bit_heic,
)

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
    (as iPhones write) or without it, is read upright, turned once, and counted as
    stored turned (``rotated``, ``prepare_report``'s count: a HEIC's was not, as
    pillow-heif turns it and clears EXIF's entry); one stating its orientation in EXIF
    alone is read as stored, as libheif and browsers show it (HEIF reads EXIF's entry as
    information only). Lossless HEIC within 0 levels, AVIF at quality 100 within 6
    levels (its loss on these waves: 3 at most, measured)."""
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
    assert info.rotated == container, (stated, orientation)
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


def test_a_ten_bit_grey_heic_tagged_by_nclx_is_converted_as_an_eight_bit_one(tmp_path):
    """A 10-bit greyscale HEIC (pillow-heif reads it 16-bit, mode ``I;16``) whose nclx box
    states Display P3 primaries and a power of 2.2 reads as the same greys at 8 bits
    with that box: converted, within a level. Its box was passed over (read as stored,
    up to 9 levels darker or lighter)."""
    pytest.importorskip("pillow_heif")
    grey = np.tile(np.arange(256, dtype=np.uint16), (8, 1))
    nclx = {"color_primaries": 12, "transfer_characteristics": 4}
    eight = np.repeat(grey.astype(np.uint8)[..., None], 3, -1)
    (want,) = decode(_item(write_nclx_heic(tmp_path / "eight.heic", eight, 12, 4)))
    assert _error(want, eight.astype(float)) > 3  # the box moves these greys
    deep = write_ten_bit_heic(tmp_path / "deep.heic", grey.astype(int) * 1023 // 255, **nclx)
    (got,) = decode(_item(deep))
    assert _error(got, np.asarray(want, dtype=float)) <= 1


@pytest.mark.parametrize(("primaries", "transfer"), list(NCLX_TWINS))
def test_a_heic_tagged_by_nclx_alone_is_converted_as_its_icc_twin(tmp_path, primaries, transfer):
    """A lossless HEIC whose colours only its nclx box states (as phones other than
    iPhones and converting tools write it) reads as the same pixels with the ICC profile
    of those primaries and transfer (converted by LittleCMS): within 1 level, 0.02 on
    average (1.5 % of levels off by one, measured). Read as stored, a Display P3 one
    was 12.9 levels off on average."""
    pytest.importorskip("pillow_heif")
    stored, profile = _stored(), NCLX_TWINS[primaries, transfer]()
    twin = write_oriented_photo(
        tmp_path / "icc.heic", stored, 1, container=False, exif=False, icc_profile=profile
    )
    (want,) = decode(_item(twin))
    want = np.asarray(want, dtype=float)
    assert np.abs(want - stored).mean() > 3  # the profile moves these colours
    (got,) = decode(_item(write_nclx_heic(tmp_path / "nclx.heic", stored, primaries, transfer)))
    assert _error(got, want) <= 1
    assert np.abs(np.asarray(got, dtype=float) - want).mean() < 0.05


@pytest.mark.parametrize(("primaries", "transfer"), [(1, 13), (1, 1), (2, 2), (1, 6), (2, 15)])
def test_a_heic_tagged_srgb_by_nclx_reads_its_levels_as_stored(tmp_path, primaries, transfer):
    """A HEIC whose nclx box states sRGB's or BT.709's colours (or leaves them
    unspecified) reads its levels as stored, byte for byte, as it read before."""
    pytest.importorskip("pillow_heif")
    stored = _stored()
    (got,) = decode(_item(write_nclx_heic(tmp_path / "srgb.heic", stored, primaries, transfer)))
    assert np.array_equal(np.asarray(got), stored)


def _grey_heic(path: Path, transfer: int, signal: np.ndarray) -> Path:
    """A HEIC of BT.2020 greys of ``transfer`` (its nclx box's), ``signal`` (0 to 1)
    across each row."""
    levels = np.round(np.tile(signal, (4, 1)) * 255).astype(np.uint8)
    return write_nclx_heic(path, np.repeat(levels[..., None], 3, -1), 9, transfer)


@pytest.mark.parametrize(("transfer", "reference_white"), [(18, 0.75), (16, 0.58)])
def test_an_hdr_heic_tagged_by_nclx_is_mapped_as_an_hdr_clip(tmp_path, transfer, reference_white):
    """A HEIC whose nclx box states HLG or PQ (BT.2020 greys) is mapped to sRGB as an HDR
    clip is to BT.709: black stays black, the reference white (HLG's 75 % signal, PQ's
    203 nits) comes out near white, brighter levels clip, greys stay grey. Read as
    stored, the reference white was 191 (HLG), 148 (PQ)."""
    from datacentric.data.media_colours import maps_to_bt709

    pytest.importorskip("pillow_heif")
    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR (the refusal's test)")
    signal = np.array([0.0, 0.25, 0.5, reference_white, 0.95])
    (got,) = decode(_item(_grey_heic(tmp_path / "hdr.heic", transfer, signal)))
    row = np.asarray(got, dtype=int)[0]
    assert (row.max(-1) - row.min(-1) <= 2).all(), row
    greys = row[:, 1]
    assert greys[0] <= 2 and greys[3] >= 235 and greys[4] == 255, greys
    assert (np.diff(greys) >= 0).all() and greys[2] > greys[1] > greys[0], greys


@pytest.mark.parametrize("transfer", [18, 16])
@pytest.mark.parametrize("grey", [False, True])
def test_a_ten_bit_hdr_heic_is_mapped_from_its_ten_bits(tmp_path, transfer, grey):
    """A 10-bit HLG or PQ HEIC (iPhones' and cameras' HDR stills; BT.2020 greys, a ramp of
    every level 0 to 1023; RGB, or greyscale) is mapped to sRGB from its 10-bit levels:
    the ramp reaches every sRGB level, in steps of one, each pixel as FFmpeg maps the
    levels scaled to 16 bits (``L << 6 | L >> 4``). Read at 8 bits first (pillow-heif's
    Pillow reader) and mapped from those, it came out in 183 levels (HLG) or 128 (PQ),
    bands up to 3 or 4 levels apart."""
    import av

    from datacentric.data.media_colours import maps_to_bt709

    pytest.importorskip("pillow_heif")
    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR (the refusal's test)")
    ramp = np.tile(np.arange(1024, dtype=np.uint16), (4, 1))
    levels = ramp if grey else np.stack([ramp] * 3, -1)
    nclx = {"color_primaries": 9, "transfer_characteristics": transfer}
    (got,) = decode(_item(write_ten_bit_heic(tmp_path / "hdr.heic", levels, **nclx)))
    got = np.asarray(got)
    greys = got[0, :, 1].astype(int)
    assert len(set(greys)) == 256 and set(np.diff(greys)) <= {0, 1}, len(set(greys))
    deep = np.stack([ramp] * 3, -1)
    frame = av.VideoFrame.from_ndarray((deep << 6) | (deep >> 4), format="rgb48le")
    frame.color_range, frame.colorspace, frame.color_trc, frame.color_primaries = 2, 0, transfer, 9
    whole = frame.reformat(format="rgb24", dst_color_trc=13, dst_color_primaries=1)
    assert np.array_equal(got, whole.to_ndarray())


def test_hdr_heics_of_other_sizes_are_mapped_by_one_scaler_map(tmp_path, monkeypatch):
    """An HLG photo and one turned the other way (a camera's landscape and portrait
    shots) are mapped by frames of one size, so the scaler's map (2 to 5 s to build
    here) is built once, not again for each size; each is mapped as a whole frame of
    its own size maps it, exactly. Each size built its map again."""
    import av

    from datacentric.data import media_colours

    pytest.importorskip("pillow_heif")
    if not media_colours.maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR (the refusal's test)")
    sizes, reformatter = [], av.video.reformatter.VideoReformatter()

    class Seen:
        def reformat(self, frame, **options):
            sizes.append((frame.height, frame.width))
            return reformatter.reformat(frame, **options)

    monkeypatch.setattr(media_colours, "_still_reformatter", lambda *c: (Seen(), nullcontext()))
    stored = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for pixels in (stored, stored.transpose(1, 0, 2)):
        (got,) = decode(_item(write_nclx_heic(tmp_path / "hlg.heic", pixels, 9, 18)))
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
        frame.color_range, frame.colorspace, frame.color_trc, frame.color_primaries = 2, 0, 18, 9
        whole = reformatter.reformat(
            frame, format="rgb24", dst_color_trc=13, dst_color_primaries=1
        ).to_ndarray()
        assert np.array_equal(np.asarray(got), whole)
    assert len(set(sizes)) == 1, sizes


def test_hdr_heics_read_by_threads_at_once_are_mapped_as_one_by_one(tmp_path):
    """HLG photos decoded by four threads at once (as a caller's thread pool may read
    them) are mapped as when read one by one: the threads share the kept scaler, one
    at a time. Two threads' frames in it at once crashed the process (a segmentation
    fault, or no end)."""
    from concurrent.futures import ThreadPoolExecutor

    from datacentric.data.media_colours import maps_to_bt709

    pytest.importorskip("pillow_heif")
    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR (the refusal's test)")
    rng, paths = np.random.default_rng(1), []
    for number in range(8):
        pixels = rng.integers(0, 256, (128, 1024, 3), dtype=np.uint8)
        paths.append(write_nclx_heic(tmp_path / f"hlg{number}.heic", pixels, 9, 18))
    alone = [np.asarray(decode(_item(path))[0]) for path in paths]
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda path: np.asarray(decode(_item(path))[0]), paths))
        assert all(np.array_equal(a, b) for a, b in zip(alone, together))


@pytest.mark.parametrize(
    ("transfer", "said"),
    [
        (18, r"colours of HLG transfer \(nclx\), which this PyAV cannot map to sRGB"),
        (17, "colours of nclx transfer 17, which is not known here"),
    ],
)
def test_a_heic_whose_nclx_colours_cannot_be_shown_is_refused_saying_why(
    tmp_path, monkeypatch, transfer, said
):
    """An HLG HEIC where PyAV cannot map HDR, and one of a transfer not known here
    (SMPTE 428's), are refused when probed (before any encoding) and decoded, in one line
    naming the colours and the fix, never read in wrong colours."""
    from datacentric.data import media_colours
    from datacentric.data.media_info import MediaError

    pytest.importorskip("pillow_heif")
    monkeypatch.setattr(media_colours, "maps_to_bt709", lambda: False)
    path = _grey_heic(tmp_path / "photo.heic", transfer, np.linspace(0, 1, 8))
    for read in (probe, decode):
        with pytest.raises(MediaError, match=f"^{said}.*: .*convert it to sRGB") as caught:
            read(_item(path))
        assert "\n" not in str(caught.value)
