"""Open-Sora-style bucket configs: which (resolution, frames) buckets latents go to.

A JSON file (``--bucket-config FILE``)::

    {"buckets": {"240p": {"1": 1.0, "51": [0.5, 8]}, "480p": {"102": 1.0}},
     "aspect_ratios": {"240p": {"0.56": [240, 426], "1.00": [320, 320]}}}

``buckets`` maps a resolution name to ``{frames: keep probability}`` (Open-Sora's
``(probability, batch size)`` pairs are accepted; the batch size is ignored, since the
planner chooses micro-batches). ``aspect_ratios`` (optional) maps a resolution to its
``{ratio name: [height, width]}`` pixel sizes; by default each of
:data:`~datacentric.data.video_geometry.RESOLUTIONS` has three: its own (``h x w``), the
portrait ``w x h`` and a square of about the same area.

A bucket's frame count is pixel frames, in ``prepare`` and in ``train`` alike; the
latents of ``n`` pixel frames have the VAE family's own number of latent frames
(:func:`~datacentric.data.video_geometry.vae_latent_frames`, by the ``temporal`` of
:meth:`BucketConfig.assign`): ``(n - 1) // temporal + 1`` for the causal VAEs of Wan,
SkyReels-V2 and HunyuanVideo, ``n * 5 // 17`` for Open-Sora's (the default).

Assignment of a latent of ``F x C x H x W`` (latent pixels = pixels / 8), as Open-Sora:
resolutions are tried from the largest area down. At one resolution, the aspect ratio
closest to ``H / W`` (in log scale) gives the bucket's latent size ``(h/8, w/8)``; the
latent must be at least that large (it is centre-cropped, never scaled), and the bucket's
frame count is the largest configured one whose latent frames (by the rule; 1 for an
image) the latent has; images (``F = 1``) go to 1-frame buckets only, videos to the
others. The sample is kept there with the bucket's probability (a draw from ``(seed,
sample index)``, the same in every epoch); if it is not kept, the next smaller
resolution is tried. A latent that fits no bucket or is kept by none is skipped and
counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.video_geometry import RESOLUTIONS, SPATIAL_DOWNSAMPLE, vae_latent_frames
from datacentric.regular_files import read_json_file


@dataclass(frozen=True)
class Bucket:
    """A chosen bucket: its name and the latent size a sample is cropped to."""

    name: str
    frames: int
    """Latent frames."""
    height: int
    width: int


def default_aspect_ratios(height: int, width: int) -> dict[str, tuple[int, int]]:
    """The resolution's own size, its portrait and a square of about the same area."""
    side = round(math.sqrt(height * width) / 16) * 16
    return {
        f"{height / width:.2f}": (height, width),
        "1.00": (side, side),
        f"{width / height:.2f}": (width, height),
    }


def closest_ratio(sizes: dict[str, tuple[int, int]], aspect: float) -> str:
    """The name of the size in ``sizes`` whose height / width is closest to ``aspect``
    (in log scale)."""
    return min(sizes, key=lambda k: abs(math.log(sizes[k][0] / sizes[k][1] / aspect)))


def _pixel_sizes(value: object, where: str) -> dict[str, tuple[int, int]]:
    """``{ratio name: [height, width]}``, each a positive whole number of pixels."""
    if not isinstance(value, dict) or not value:
        raise DataError(f"{where}: want {{ratio name: [height, width]}}, at least one")
    sizes = {}
    for name, size in value.items():
        if not (
            isinstance(size, list)
            and len(size) == 2
            and all(type(n) is int and n > 0 for n in size)
        ):
            raise DataError(f"{where}.{name}: want [height, width] in pixels, got {size!r:.80}")
        sizes[name] = (size[0], size[1])
    return sizes


class BucketConfig:
    """A parsed bucket config; :meth:`assign` places one latent."""

    def __init__(self, data: dict, source: str = "bucket config") -> None:
        if not isinstance(data, dict) or not isinstance(data.get("buckets"), dict):
            raise DataError(f"{source}: needs an object with a 'buckets' object")
        ratios = data.get("aspect_ratios", {})
        if not isinstance(ratios, dict):
            raise DataError(f"{source}: 'aspect_ratios' must be an object of resolutions")
        self.source = source
        self.table: list[tuple[str, dict[str, tuple[int, int]], list[tuple[int, float]]]] = []
        for res, frames in data["buckets"].items():
            if res in ratios:
                sizes = _pixel_sizes(ratios[res], f"{source}: aspect_ratios.{res}")
            elif res in RESOLUTIONS:
                sizes = default_aspect_ratios(*RESOLUTIONS[res])
            else:
                raise DataError(
                    f"{source}: resolution {res!r} is neither one of "
                    f"{', '.join(RESOLUTIONS)} nor given in 'aspect_ratios'"
                )
            try:
                probs = [
                    (int(n), float(p[0] if isinstance(p, list | tuple) else p))
                    for n, p in frames.items()
                ]
            except (TypeError, ValueError, AttributeError, IndexError):
                raise DataError(f"{source}: {res}: want {{frames: probability}}") from None
            self.table.append((res, sizes, sorted(probs, reverse=True)))
        area = lambda row: max(h * w for h, w in row[1].values())
        self.table.sort(key=area, reverse=True)

    @classmethod
    def load(cls, path: str) -> BucketConfig:
        """Read a JSON bucket config; a missing or malformed file is a ``DataError``."""
        try:
            data = read_json_file(path, error=DataError)
        except FileNotFoundError:
            raise DataError(f"--bucket-config {path}: no such file") from None
        except DataError as err:
            raise DataError(f"--bucket-config {err}") from None
        return cls(data, f"--bucket-config {path}")

    def named(self, name: str) -> tuple[str, str, int] | None:
        """``(resolution, aspect ratio, frames)`` of the bucket called ``name`` (as
        :meth:`assign` and ``prepare`` name them, ``240p-0.56-51f``), or None when this
        config has no such bucket."""
        for res, sizes, probs in self.table:
            for ratio in sizes:
                for frames, _ in probs:
                    if name == f"{res}-{ratio}-{frames}f":
                        return res, ratio, frames
        return None

    def assign(
        self, shape: tuple[int, int, int], rng: np.random.Generator, temporal: int | None = None
    ) -> Bucket | None:
        """The bucket of a latent of ``(frames, height, width)`` latent pixels, or None;
        ``temporal``: the causal VAE's frames per latent frame, which decides a bucket's
        latent frames (:func:`~datacentric.data.video_geometry.vae_latent_frames`; None:
        Open-Sora's rule)."""
        f, h, w = shape
        for res, sizes, probs in self.table:
            ratio = closest_ratio(sizes, h / w)
            hb, wb = (n // SPATIAL_DOWNSAMPLE for n in sizes[ratio])
            if h < hb or w < wb:
                continue
            fits = [
                (n, p)
                for n, p in probs
                if (n == 1) == (f == 1) and vae_latent_frames(n, temporal) <= f
            ]
            if not fits:
                continue
            frames, keep = fits[0]
            if keep >= 1 or rng.random() < keep:
                latent = vae_latent_frames(frames, temporal)
                return Bucket(f"{res}-{ratio}-{frames}f", latent, hb, wb)
        return None


def prepared_bucket(
    buckets: BucketConfig,
    shape: tuple[int, int, int],
    recorded: tuple[str | None, int],
    rng: np.random.Generator,
    where: str,
) -> Bucket | None:
    """The bucket of a latent of ``(frames, height, width)`` that ``prepare`` made:
    ``recorded``, its manifest's ``(bucket or None, pixel frames)``. Its recorded bucket
    when the config has it (whole, never redrawn), else one assigned by the VAE's own
    latent-frame rule; :class:`DataError` starting with ``where`` (the manifest line and
    the file) when that bucket would cut its frames."""
    f, h, w = shape
    name, pixel_frames = recorded
    if name and buckets.named(name) is not None:
        return Bucket(name, f, h, w)
    # prepare keeps temporal k + 1 pixel frames for k + 1 latent frames: its temporal
    temporal = (pixel_frames - 1) // (f - 1) if f > 1 else 1
    bucket = buckets.assign(shape, rng, max(1, temporal))
    if bucket is not None and bucket.frames != f:
        raise DataError(
            f"{where} was prepared from {pixel_frames} frames ({f} latent frames); "
            f"{buckets.source} puts it in bucket {bucket.name}, which trains "
            f"{bucket.frames} of them. Train with the --bucket-config it was prepared with "
            "(or none), or prepare it again with this one"
        )
    return bucket
