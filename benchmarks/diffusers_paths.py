"""Wan on CPU: the generic diffusers path against the hand-written packed adapter.

    .venv/bin/python benchmarks/diffusers_paths.py [--repeats 7]

Both paths hold the same tiny random-weight ``WanTransformer3DModel`` (seed 0) and run
forward + backward of the same micro-batches in one process (one thread): a video
bucket's micro-batch (clips of one shape) and a mixed one (three shapes). The generic
path (``models/diffusers_generic.py``) stacks same-shape clips and calls the model's
own ``forward`` once per shape; the packed adapter (``models/diffusers_video.py``)
re-runs Wan's submodules on the packed tokens. Median wall time of ``--repeats`` passes
after one warm-up; writes ``diffusers_paths.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from datacentric.data.video import SyntheticVideoDataset
from datacentric.models.diffusers_build import TINY_DIFFUSERS, build_diffusers_model
from datacentric.models.diffusers_video import build_wan
from datacentric.shapes import SampleShape

CASES = {
    "bucket: 4 clips of 4x8x8": [(4, 8, 8)] * 4,
    "mixed: 3 shapes, 5 clips": [(4, 8, 8), (2, 8, 8), (4, 8, 8), (1, 8, 12), (2, 8, 8)],
}


def time_pass(model, batch, repeats: int) -> float:  # noqa: ANN001
    """Median seconds of forward + backward of ``batch``."""
    times = []
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(batch).sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    config = TINY_DIFFUSERS["wan"][1]
    rows = []
    for name, grids in CASES.items():
        data = SyntheticVideoDataset(
            [SampleShape.video(*g) for g in grids],
            channels=config["in_channels"],
            patch=(1, 2, 2),
            context_shape=(5, config["text_dim"]),
        )
        batch = data.pack(list(range(len(grids))), 1)
        torch.manual_seed(0)
        generic = build_diffusers_model("wan")
        torch.manual_seed(0)
        packed = build_wan()
        t_generic = time_pass(generic, batch, args.repeats)
        t_packed = time_pass(packed, batch, args.repeats)
        rows.append((name, batch.num_tokens, t_generic, t_packed))
        print(f"{name}: generic {t_generic * 1e3:.1f} ms, packed {t_packed * 1e3:.1f} ms")
    lines = [
        "# Wan on CPU: generic diffusers path vs packed adapter",
        "",
        f"Measured {dt.date.today().isoformat()} by `benchmarks/diffusers_paths.py` on "
        f"{platform.processor() or platform.machine()}, one thread, torch {torch.__version__}; "
        f"load average before {load_before[0]:.2f} (shared machine: read ratios, not times).",
        "Forward + backward of one micro-batch, median of "
        f"{args.repeats} passes after a warm-up, tiny `diffusers:wan` (4 blocks, width 64).",
        "",
        "| micro-batch | tokens | generic (ms) | packed (ms) | packed / generic |",
        "|---|---|---|---|---|",
    ]
    for name, tokens, t_generic, t_packed in rows:
        lines.append(
            f"| {name} | {tokens} | {t_generic * 1e3:.1f} | {t_packed * 1e3:.1f} | "
            f"{t_packed / t_generic:.2f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
