"""AVIF photos whose colours their ``nclx`` box alone states (Display P3, BT.2020: as
phones, cameras and converting tools write them without an ICC profile) reach
``prepare`` converted to sRGB as the ICC profile of the same primaries and transfer
converts them, as HEICs' are (``test_heif_photos``): Pillow's AVIF reader reads no
``nclx`` box, so the container's own is read (:mod:`datacentric.data.media_boxes`),
within its bounds; a container whose boxes do not fit is refused naming the file."""

from __future__ import annotations

import numpy as np
import pytest
from fidelity_clips import _item
from media_formats import NCLX_TWINS, wave_frames, write_nclx_avif, write_nclx_heic

from datacentric.data.media_boxes import BoxError, nclx_box, primary_properties
from datacentric.data.media_decode import decode

pytest.importorskip("av")


def _needs_avif() -> None:
    from PIL import features

    if not features.check("avif"):
        pytest.skip("this Pillow is built without libavif")


def _smooth() -> np.ndarray:
    """64 x 96 waves, smooth enough for 4:2:0 (AV1's loss on them a few levels)."""
    return wave_frames(1, 64, 96)[0]


@pytest.mark.parametrize(("primaries", "transfer"), [(12, 13), (9, 1)])
def test_an_avif_tagged_by_nclx_alone_is_converted_as_its_icc_twin(tmp_path, primaries, transfer):
    """An AVIF of Display P3 (sRGB's transfer) or BT.2020 (BT.709's) colours stated by its
    nclx box alone reads as its decoded levels with the ICC profile of those colours (a
    PNG, converted by LittleCMS): within 1 level, under 0.05 on average. Pillow reads no
    box; its levels were taken as sRGB's, 13.8 (Display P3) and 21.2 (BT.2020) levels off
    on average here. The box is checked as written: by our reader and by FFmpeg's."""
    import av
    from PIL import Image

    _needs_avif()
    path = write_nclx_avif(tmp_path / "nclx.avif", _smooth(), primaries, transfer)
    stated = nclx_box(path)
    assert stated is not None
    assert (stated["color_primaries"], stated["transfer_characteristics"]) == (primaries, transfer)
    with av.open(str(path)) as container:
        context = container.streams.video[0].codec_context
        assert (int(context.color_primaries), int(context.color_trc)) == (primaries, transfer)
    with Image.open(path) as image:
        assert "icc_profile" not in image.info and "nclx_profile" not in image.info
        levels = np.asarray(image.convert("RGB"))
    twin = tmp_path / "twin.png"
    Image.fromarray(levels).save(twin, icc_profile=NCLX_TWINS[primaries, transfer]())
    (want,) = decode(_item(twin))
    want = np.asarray(want, dtype=float)
    assert np.abs(want - levels).mean() > 3  # the profile moves these colours
    (got,) = decode(_item(path))
    got = np.asarray(got, dtype=float)
    assert np.abs(got - want).max() <= 1
    assert np.abs(got - want).mean() < 0.05


def test_an_avif_tagged_srgb_by_pillow_reads_its_levels_as_stored(tmp_path):
    """Pillow's AVIF writer states sRGB's colours in its nclx box (primaries 1, transfer
    13): such a photo reads as Pillow decodes it, byte for byte, as before."""
    from PIL import Image

    _needs_avif()
    path = tmp_path / "srgb.avif"
    Image.fromarray(_smooth()).save(path, quality=90)
    assert nclx_box(path) == {
        "color_primaries": 1,
        "transfer_characteristics": 13,
        "matrix_coefficients": 6,
        "full_range_flag": 1,
    }
    with Image.open(path) as image:
        stored = np.asarray(image.convert("RGB"))
    (got,) = decode(_item(path))
    assert np.array_equal(np.asarray(got), stored)


def _box(kind: bytes, body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + kind + body


def test_a_file_without_a_meta_box_or_nclx_states_nothing(tmp_path):
    """A file of no ``meta`` box (a bare ``ftyp``), and one whose primary item has no
    ``colr`` box, state no colours: read as sRGB, as libavif reads them."""
    bare = tmp_path / "bare.avif"
    bare.write_bytes(_box(b"ftyp", b"avif\0\0\0\0avif"))
    assert primary_properties(bare) == [] and nclx_box(bare) is None
    ipco = _box(b"ipco", _box(b"ispe", bytes(12)))
    ipma = _box(b"ipma", bytes(4) + (1).to_bytes(4, "big") + b"\0\1\1\x81")
    meta = _box(b"meta", bytes(4) + _box(b"pitm", bytes(4) + b"\0\1") + _box(b"iprp", ipco + ipma))
    plain = tmp_path / "plain.avif"
    plain.write_bytes(_box(b"ftyp", b"avif\0\0\0\0avif") + meta)
    assert primary_properties(plain) == [("ispe", bytes(12))] and nclx_box(plain) is None


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda meta: meta[:-3], "a box of"),  # the meta box runs past the file's end
        (lambda meta: meta.replace(b"\x81", b"\x85"), "property 5 of 1 associated"),
        (lambda meta: meta.replace(b"\0\0\0\x14ispe", b"\0\0\0\x04ispe"), "a box of 4 bytes"),
    ],
)
def test_a_container_whose_boxes_do_not_fit_is_refused_naming_the_file(tmp_path, damage, said):
    """A ``meta`` box longer than the file, an ``ipma`` box associating a property
    ``ipco`` does not hold, a box shorter than its header: one line naming the file and
    what is wrong, never an IndexError or a read past the bytes."""
    ipco = _box(b"ipco", _box(b"ispe", bytes(12)))
    ipma = _box(b"ipma", bytes(4) + (1).to_bytes(4, "big") + b"\0\1\1\x81")
    meta = _box(b"meta", bytes(4) + _box(b"pitm", bytes(4) + b"\0\1") + _box(b"iprp", ipco + ipma))
    path = tmp_path / "photo.avif"
    path.write_bytes(_box(b"ftyp", b"avif\0\0\0\0avif") + damage(meta))
    with pytest.raises(BoxError, match=f"^photo.avif: malformed HEIF/AVIF container .*{said}"):
        nclx_box(path)


def test_an_hdr_avif_tagged_by_nclx_is_mapped_as_a_heic_of_its_levels(tmp_path):
    """An AVIF whose nclx box states HLG (BT.2020 greys and colours) is mapped to sRGB as
    a HEIC of the same decoded levels and box is (an HDR clip's map): exactly. It was
    read as stored, its reference white (75 % signal) as 191 of 255."""
    from PIL import Image

    from datacentric.data.media_colours import maps_to_bt709

    _needs_avif()
    pytest.importorskip("pillow_heif")
    if not maps_to_bt709():
        pytest.skip("this PyAV's scaler does not map HDR")
    path = write_nclx_avif(tmp_path / "hlg.avif", _smooth(), 9, 18)
    with Image.open(path) as image:
        levels = np.asarray(image.convert("RGB"))
    (want,) = decode(_item(write_nclx_heic(tmp_path / "hlg.heic", levels, 9, 18)))
    (got,) = decode(_item(path))
    assert np.abs(np.asarray(want, dtype=int) - levels).mean() > 10  # the map moves them
    assert np.array_equal(np.asarray(got), np.asarray(want))
