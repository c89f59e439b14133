"""Workload presets: the sample shapes of a dataset plus its default model and hardware.

Presets (see ``docs/simulator.md`` for the exact definitions and why):

- ``opensora-short``, ``opensora-balanced``, ``opensora-long``: the Open-Sora v1.2
  benchmark buckets (5 resolutions x {1, 51, 102, 204, 408} frames) with video counts
  drawn from one Zipf family (short: smallest buckets most frequent; long: the mirror;
  balanced: uniform) and 50 images per video mixed in by the same rule;
- ``stdlib-code``: the real file lengths of the embedded standard-library corpus;
- ``sft-longtail``: 99.89% of samples around 1K tokens, 0.11% around 37K;
- ``longctx-1m``: long-context text, lengths log-uniform from 8K to 1M tokens.

Every preset is a pure function of ``(seed, num_samples)``: the same arguments give
the same shapes in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from datacentric.data import video_buckets as vb
from datacentric.data.video_geometry import benchmark_video_shapes
from datacentric.shapes import SampleShape, read_lengths_file


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A dataset's sample shapes with the model and hardware it is simulated on."""

    name: str
    """Preset name, or ``lengths:<file>`` for a lengths file."""
    shapes: tuple[SampleShape, ...]
    """Sample shapes; the index is the sample id."""
    model: str
    """Default model preset name (for ``get_model_spec``)."""
    hardware: str
    """Default hardware preset name (for ``get_hardware``)."""
    description: str
    """One line saying what the workload is."""

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shapes)


# --------------------------------------------------------------------------- helpers


def zipf_weights(n: int, alpha: float, offset: float) -> list[float]:
    """Normalised Zipf weights ``p_k ~ (k + offset) ** -alpha`` for ranks ``k = 1..n``."""
    raw = [(k + offset) ** -alpha for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder).

    The counts sum to ``total`` exactly and each is within 1 of its exact share.
    """
    if total < 0:
        raise ValueError(f"cannot apportion a negative count ({total})")
    norm = sum(weights)
    exact = [total * w / norm for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def video_bucket_shapes() -> tuple[list[SampleShape], list[SampleShape]]:
    """Image and video bucket shapes of the benchmark, each sorted by tokens."""
    images, videos = [], []
    for (_, frames), shape in benchmark_video_shapes().items():
        (images if frames == 1 else videos).append(shape)
    key = lambda s: (s.tokens, s.grid)
    return sorted(images, key=key), sorted(videos, key=key)


# --------------------------------------------------------------------------- presets

#: Zipf shape of each Open-Sora preset: (alpha, ascending).
#: ``ascending`` ranks buckets from the smallest (rank 1, most frequent) up; otherwise
#: the largest bucket gets rank 1. alpha 0 is the uniform distribution.
OPENSORA_MIXES: dict[str, tuple[float, bool]] = {
    "opensora-short": (vb.ZIPF_ALPHA, True),
    "opensora-balanced": (0.0, True),
    "opensora-long": (vb.ZIPF_ALPHA, False),
}


def opensora_workload(name: str, seed: int = 0, num_samples: int | None = None) -> Workload:
    """One of the three Open-Sora presets (see :data:`OPENSORA_MIXES`)."""
    alpha, ascending = OPENSORA_MIXES[name]
    per_video = 1 + vb.IMAGES_PER_VIDEO
    total = vb.BENCHMARK_VIDEOS * per_video if num_samples is None else int(num_samples)
    if total < 2:
        raise ValueError(f"{name}: need at least 2 samples (one video, one image), got {total}")
    n_videos = max(1, round(total / per_video))
    n_images = total - n_videos
    image_buckets, video_buckets = video_bucket_shapes()
    shapes: list[SampleShape] = []
    for buckets, count in ((image_buckets, n_images), (video_buckets, n_videos)):
        weights = zipf_weights(len(buckets), alpha, vb.ZIPF_OFFSET)
        if not ascending:
            weights.reverse()
        for shape, c in zip(buckets, apportion(count, weights)):
            shapes.extend([shape] * c)
    order = np.random.default_rng(seed).permutation(len(shapes))
    kind = {True: "smallest", False: "largest"}[ascending]
    rule = (
        "uniform" if alpha == 0 else f"Zipf(alpha={alpha}, offset={vb.ZIPF_OFFSET}), {kind} first"
    )
    return Workload(
        name=name,
        shapes=tuple(shapes[i] for i in order),
        model=vb.BENCHMARK_MODEL,
        hardware=vb.BENCHMARK_HARDWARE,
        description=(
            f"Open-Sora v1.2 buckets: {n_videos} videos and {n_images} images, {rule} over "
            "buckets sorted by tokens"
        ),
    )


#: sft-longtail: share of long samples and the two length modes (median tokens, sigma
#: of the log-normal spread, clip range).
SFT_LONG_SHARE = 0.0011
SFT_SHORT_MODE = (1024, 0.35, (128, 4096))
SFT_LONG_MODE = (37_000, 0.10, (24_000, 56_000))
SFT_DEFAULT_SAMPLES = 100_000


def sft_longtail_workload(seed: int = 0, num_samples: int | None = None) -> Workload:
    """99.89% of samples log-normal around 1K tokens, 0.11% around 37K (Llama-3 SFT mix)."""
    total = SFT_DEFAULT_SAMPLES if num_samples is None else int(num_samples)
    if total < 1:
        raise ValueError(f"sft-longtail: need at least one sample, got {total}")
    n_long = round(SFT_LONG_SHARE * total)
    rng = np.random.default_rng(seed)

    def draw(count: int, mode: tuple[int, float, tuple[int, int]]) -> np.ndarray:
        median, sigma, (low, high) = mode
        return np.clip(np.rint(median * rng.lognormal(0.0, sigma, count)), low, high)

    lengths = np.concatenate([draw(total - n_long, SFT_SHORT_MODE), draw(n_long, SFT_LONG_MODE)])
    lengths = lengths[rng.permutation(total)]
    return Workload(
        name="sft-longtail",
        shapes=tuple(SampleShape.text(int(x)) for x in lengths),
        model="llama-7b",
        hardware="h200-sxm",
        description=(
            f"{total - n_long} samples around {SFT_SHORT_MODE[0]} tokens and {n_long} around "
            f"{SFT_LONG_MODE[0]} (log-normal, Llama-3 SFT long tail)"
        ),
    )


#: longctx-1m: log-uniform token lengths between these bounds, and the default count.
LONGCTX_RANGE = (8_192, 1_048_576)
LONGCTX_DEFAULT_SAMPLES = 1_000


def longctx_workload(seed: int = 0, num_samples: int | None = None) -> Workload:
    """Long-context text: lengths log-uniform from 8K to 1M tokens (a context-extension
    mix where the longest samples need more ranks than the model has heads)."""
    total = LONGCTX_DEFAULT_SAMPLES if num_samples is None else int(num_samples)
    if total < 1:
        raise ValueError(f"longctx-1m: need at least one sample, got {total}")
    low, high = LONGCTX_RANGE
    rng = np.random.default_rng(seed)
    lengths = np.rint(np.exp(rng.uniform(np.log(low), np.log(high), total)))
    return Workload(
        name="longctx-1m",
        shapes=tuple(SampleShape.text(int(x)) for x in lengths),
        model="llama-7b",
        hardware="h200-sxm",
        description=f"{total} samples, lengths log-uniform from {low} to {high} tokens",
    )


#: stdlib-code: files longer than this are split into near-equal chunks (a 128K context);
#: only 4 files of the corpus are that long, so lengths stay the files' own.
STDLIB_MAX_TOKENS = 131_072


def stdlib_code_workload(seed: int = 0, num_samples: int | None = None) -> Workload:
    """Real file lengths of the embedded standard-library corpus (``datacentric.data``).

    The corpus fixes the lengths; ``seed`` orders them and ``num_samples`` keeps that
    many (files repeat in seeded order when more are asked than the corpus holds).
    """
    from datacentric.data.stdlib import StdlibCorpus  # reads files; packs with torch

    lengths = StdlibCorpus(max_tokens=STDLIB_MAX_TOKENS).shapes()
    rng = np.random.default_rng(seed)
    total = len(lengths) if num_samples is None else int(num_samples)
    picks = np.concatenate(
        [rng.permutation(len(lengths)) for _ in range(-(-total // len(lengths)))]
    )[:total]
    return Workload(
        name="stdlib-code",
        shapes=tuple(lengths[i] for i in picks),
        model="llama-7b",
        hardware="h200-sxm",
        description=f"{total} Python standard-library files (tokenised lengths)",
    )


_PRESETS: dict[str, Callable[[int, int | None], Workload]] = {
    **{
        name: (lambda seed, n, _name=name: opensora_workload(_name, seed, n))
        for name in OPENSORA_MIXES
    },
    "stdlib-code": stdlib_code_workload,
    "sft-longtail": sft_longtail_workload,
    "longctx-1m": longctx_workload,
}


def list_workloads() -> list[str]:
    """Names of the workload presets."""
    return sorted(_PRESETS)


def get_workload(name: str, seed: int = 0, num_samples: int | None = None) -> Workload:
    """The preset ``name``; deterministic in ``(seed, num_samples)``."""
    if name not in _PRESETS:
        raise ValueError(f"unknown workload {name!r}; presets: {', '.join(list_workloads())}")
    return _PRESETS[name](seed, num_samples)


def preset_shapes(spec: str, seed: int, num_samples: int | None) -> list[SampleShape] | None:
    """The shapes a dataset of the workload preset ``spec`` holds (``num_samples``: the
    ``[data] dataset_limit``), or None when ``spec`` names no preset: the one reading
    of a preset's samples, for ``open_dataset`` and for the commands that need only
    the shapes (they import no torch)."""
    if spec not in _PRESETS:
        return None
    return list(get_workload(spec, seed=seed, num_samples=num_samples).shapes)


def workload_from_lengths(
    path: str, model: str | None = None, hardware: str | None = None
) -> Workload:
    """A workload from a lengths file (``TOKENS`` or ``FRAMES HEIGHT WIDTH`` per line).

    Without ``model``/``hardware``, video files default to the Open-Sora benchmark's
    and text files to ``llama-7b`` on ``h200-sxm``.
    """
    shapes = read_lengths_file(path)
    return workload_from_shapes(f"lengths:{path}", shapes, model, hardware, f"read from {path}")


def workload_from_shapes(
    name: str,
    shapes: Sequence[SampleShape],
    model: str | None = None,
    hardware: str | None = None,
    source: str = "",
) -> Workload:
    """A workload of any dataset's sample shapes; without ``model``/``hardware``, video
    defaults to the Open-Sora benchmark's and text to ``llama-7b`` on ``h200-sxm``."""
    video = any(s.is_video for s in shapes)
    return Workload(
        name=name,
        shapes=tuple(shapes),
        model=model or (vb.BENCHMARK_MODEL if video else "llama-7b"),
        hardware=hardware or (vb.BENCHMARK_HARDWARE if video else "h200-sxm"),
        description=f"{len(shapes)} samples {source}".strip(),
    )
