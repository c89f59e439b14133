"""A folder of clips and photos as a user has one, prepared end to end: every container
docs/prepare.md lists (MP4 H.264 with an AAC track first, H.265 and AV1 MP4, MOV, AVI
MPEG-4, MKV FFV1, WebM VP9 and VP8, GIF), PNG and JPEG stills, a phone photo with EXIF
orientation 6 and a portrait clip with a 90-degree display rotation, and two files under
the documented minimums, listed three ways (a spreadsheet's CSV: BOM and CRLF; Hugging
Face's ``metadata.jsonl`` with ``file_name``; ``NAME.txt`` files). Each way gives the same
samples, byte for byte, and each latent equals the pipeline VAE's of the upright frames."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from media_formats import FORMATS, write_format_clip, write_h265_clip
from prepare_media import decoded_frames, save_wan_pipeline, write_image

pytest.importorskip("diffusers")
pytest.importorskip("av")

from runtime.prepare.test_prepare_media import _vae_latent  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from datacentric.prepare import PrepareJob, prepare  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: clip -> frames written (FORMATS at 32 x 48; H.265 at 64 x 64; a portrait turned 90)
CLIPS = {name: 5 + 2 * k for k, name in enumerate(FORMATS)} | {"h265.mp4": 9, "portrait.mp4": 9}
#: stills -> (height, width) as stored
STILLS = {"still.png": (32, 48), "photo.jpg": (48, 32), "phone.jpg": (32, 48), "edge.png": (16, 16)}
#: under the documented minimums (5 frames, 16 x 16 pixels): file -> the reason given
UNDER = {"short.mp4": "too short: 4 frames", "tiny.png": "too small: 8x8 pixels"}


def _caption(name: str) -> str:
    return f'{name}: a cat, "walking", on grass'


def _write_media(folder: Path) -> None:
    from PIL import Image

    folder.mkdir()
    for number, (name, frames) in enumerate(CLIPS.items()):
        if name == "h265.mp4":
            write_h265_clip(folder / name, frames, seed=number)
        else:
            write_format_clip(
                folder / name, frames, 32, 48, seed=number, rotation=90 * (name == "portrait.mp4")
            )
    for number, (name, (height, width)) in enumerate(STILLS.items()):
        write_image(folder / name, height, width, seed=number)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise: 48 x 32
    with Image.open(folder / "phone.jpg") as image:
        pixels = image.convert("RGB")
    pixels.save(folder / "phone.jpg", exif=exif)
    write_format_clip(folder / "short.mp4", 4, 32, 48)
    write_image(folder / "tiny.png", 8, 8)


def _listed(media: Path, root: Path) -> dict[str, Path]:
    """The media in three folders, listed three ways: what ``--media`` is given for each."""
    names = sorted(p.name for p in media.iterdir())
    ways = {}
    for way in ("csv", "hf", "txt"):
        shutil.copytree(media, root / way)
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\r\n")
    rows = [(name, _caption(name)) for name in names]
    writer.writerows([("path", "caption"), *rows, rows[0]])  # the first line again
    (root / "csv" / "list.csv").write_bytes(("\ufeff" + text.getvalue()).encode())
    ways["csv"] = root / "csv" / "list.csv"
    lines = [json.dumps({"file_name": name, "text": _caption(name)}) for name in names]
    (root / "hf" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    ways["hf"] = root / "hf"
    for name in names:
        (root / "txt" / name).with_suffix(".txt").write_text(_caption(name))
    ways["txt"] = root / "txt"
    return ways


def _upright(media: Path, name: str) -> list[np.ndarray]:
    """The frames a viewer shows, turned here with numpy from what the files store."""
    from PIL import Image

    if name in STILLS:
        with Image.open(media / name) as image:
            stored = np.asarray(image.convert("RGB"))
        return [np.rot90(stored, k=-1) if name == "phone.jpg" else stored]
    frames = [np.asarray(f) for f in decoded_frames(media / name)]
    return [np.rot90(f, k=1) for f in frames] if name == "portrait.mp4" else frames


def _samples(out: Path) -> dict[str, tuple]:
    """Each sample's manifest fields and latent and text tensors, by source file."""
    samples = {}
    for line in (out / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        tensors = [load_file(out / entry[k])[k] for k in ("latent", "text")]
        fields = (entry["caption"], entry["frames"], entry["bucket"])
        samples[entry["source"]] = (fields, tensors)
    return samples


def test_every_listing_of_the_folder_gives_the_same_upright_samples(tmp_path):
    from diffusers import WanPipeline

    pipe_dir = save_wan_pipeline(tmp_path / "pipe")
    _write_media(tmp_path / "media")
    ways = _listed(tmp_path / "media", tmp_path)
    samples, reports = {}, {}
    for way, media in ways.items():
        out = tmp_path / f"out-{way}"
        reports[way] = prepare(PrepareJob(pipeline=str(pipe_dir), media=str(media), out=str(out)))
        samples[way] = _samples(out)
    wanted = set(CLIPS) | set(STILLS)
    for way, report in reports.items():
        assert report["samples"] == len(wanted) and set(samples[way]) == wanted, way
        assert report["duplicates"] == (way == "csv") and report["rotated"] == 2, way
        reasons = sorted(
            s["reason"] for s in report["skipped_files"] if "duplicate" not in s["reason"]
        )
        assert [r.split(",")[0] for r in reasons] == sorted(UNDER.values()), reasons
    for way in ("hf", "txt"):
        for source, (fields, tensors) in samples["csv"].items():
            assert samples[way][source][0] == fields, (way, source)
            assert all(map(torch.equal, samples[way][source][1], tensors)), (way, source)
    pipe = WanPipeline.from_pretrained(pipe_dir, local_files_only=True)
    for source, ((caption, frames, bucket), (latent, _)) in samples["csv"].items():
        upright = _upright(tmp_path / "media", source)
        kept = (len(upright) - 1) // 4 * 4 + 1
        h, w = upright[0].shape[:2]
        assert caption == _caption(source) and (frames, bucket) == (kept, f"{kept}x{h}x{w}")
        assert latent.shape == (1 + (kept - 1) // 4, 4, h // 8, w // 8), source
        images = [_image(f) for f in upright[:kept]]
        torch.testing.assert_close(latent, _vae_latent(pipe, images, h, w), rtol=0, atol=1e-5)
    assert samples["csv"]["phone.jpg"][1][0].shape[-2:] == (6, 4)  # upright: 48 x 32
    assert samples["csv"]["portrait.mp4"][1][0].shape[-2:] == (6, 4)


def _image(frame: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(frame))
