"""GPU measurements for the cost model: one prepared script, under 8 minutes on one H200.

Re-measures, on one GPU, the tables the cost model is calibrated from:

- ``block_times``: llama-7b and dit3d-1b shaped models at 2 and 4 blocks, one sample
  per pass, bf16 autocast, forward + backward; the 4-block model also with every
  block recomputing (recomputation overhead); peak memory of each pass;
- ``packed``: one long sample against many short samples of the same total tokens
  in one micro-batch (the per-sample and per-segment costs), each with the attention
  kernels it actually ran (``attention_path``: ``sdpa``, ``varlen``, or ``sdpa+varlen``
  when long segments went to SDPA; ``attention_calls`` counts the calls);
- ``attention``: attention alone (228 segments of 144 tokens, 24 heads of 64, bf16,
  forward + backward) on every path the device has.

Each pass is timed with CUDA events (median of ``--repeats`` after two warm-ups).
Writes ``gpu_bench.json``; ``block_times`` and ``packed`` rows have the fields of the
shipped measurement files, so ``datacentric calibrate --measurements gpu_bench.json``
reads it like them. ``--smoke`` runs the same code at tiny sizes on the CPU (tests).

    python benchmarks/gpu_bench.py --out benchmarks/results/gpu_bench.json
    python benchmarks/gpu_bench.py --smoke --out /tmp/gpu_bench.json
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import torch

from datacentric.data import SyntheticTextDataset, SyntheticVideoDataset
from datacentric.models import attention as attention_module
from datacentric.models.presets import build_model, model_config
from datacentric.parallel.loss import LossWeights, loss_tokens_function
from datacentric.parallel.recompute import BlockRecompute
from datacentric.planning.spec_derivation import spec_from_model_config
from datacentric.profiling.factory import analytic_cost_model
from datacentric.shapes import SampleShape

#: (model, shapes of one sample per pass) measured at 2 and 4 blocks
BLOCK_CASES = {
    "llama-7b": [SampleShape.text(n) for n in (1024, 4096, 16384, 32768)],
    "dit3d-1b": [
        SampleShape.video(*g) for g in ((4, 16, 16), (16, 16, 32), (16, 32, 32), (32, 32, 32))
    ],
}
#: (model, one sample, many samples of about the same total tokens)
PACKED_CASES = [
    ("llama-7b", SampleShape.text(32768), SampleShape.text(512), 64),
    ("llama-7b", SampleShape.text(16384), SampleShape.text(128), 128),
    ("dit3d-1b", SampleShape.video(16, 32, 64), SampleShape.video(1, 9, 16), 228),
    ("dit3d-1b", SampleShape.video(8, 32, 32), SampleShape.video(2, 16, 16), 16),
]
SMOKE_BLOCK_CASES = {"llama": [SampleShape.text(64)], "dit": [SampleShape.video(2, 4, 4)]}
SMOKE_PACKED_CASES = [("llama", SampleShape.text(64), SampleShape.text(8), 8)]


class Timer:
    """Seconds of a callable on the device: CUDA events, or the wall clock on the CPU."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def __call__(self, fn: Callable[[], None]) -> float:
        fn()
        fn()  # warm-ups: kernels chosen, allocator primed
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                began = time.perf_counter()
                fn()
                times.append(time.perf_counter() - began)
        return statistics.median(times)


def peak_bytes(device: torch.device) -> int:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def predicted_peak(name: str, depth: int, shape: SampleShape, recompute: bool) -> int:
    """The analytic planner's peak bytes of one pass of ``name`` at ``depth`` blocks
    (what ``peak*_bytes`` is measured against; no optimizer states in either)."""
    spec = spec_from_model_config(replace(model_config(name), num_layers=depth), name)
    model = analytic_cost_model(spec, "h200-sxm", shard="none")
    return int(model.pass_memory_bytes([shape], 1, (recompute,) * depth))


def dataset_of(shapes: list[SampleShape]) -> SyntheticTextDataset | SyntheticVideoDataset:
    kind = SyntheticVideoDataset if shapes[0].grid is not None else SyntheticTextDataset
    return kind(shapes, seed=0)


def pass_fn(model: torch.nn.Module, dataset: Any, device: torch.device) -> Callable[[], None]:
    """One forward + backward of all of ``dataset``'s samples packed in one micro-batch."""
    batch = dataset.pack(list(range(len(dataset))), 1).to(device)
    weights = LossWeights.for_samples(
        model.loss_mode, batch.sample_ids, loss_tokens_function(dataset)
    )

    def once() -> None:
        with torch.autocast(device.type, torch.bfloat16):
            loss = weights.weighted_sum(model(batch), batch)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return once


def block_times(device: torch.device, timer: Timer, cases: dict) -> list[dict[str, Any]]:
    rows = []
    for name, shapes in cases.items():
        for shape in shapes:
            row: dict[str, Any] = {"model": name, "tokens": shape.tokens, "grid": shape.grid}
            try:
                for depth in (2, 4):
                    torch.manual_seed(0)
                    model = build_model(name, device=device, num_layers=depth)
                    once = pass_fn(model, dataset_of([shape]), device)
                    reset_peak(device)
                    row[f"t{depth}_s"] = timer(once)
                    row[f"peak{depth}_bytes"] = peak_bytes(device)
                    row[f"predicted_peak{depth}_bytes"] = predicted_peak(name, depth, shape, False)
                    if depth == 4:
                        switch = BlockRecompute.apply(model)
                        with switch.use((True,) * depth):
                            reset_peak(device)
                            row["t4_recompute_s"] = timer(once)
                            row["peak4_recompute_bytes"] = peak_bytes(device)
                        row["predicted_peak4_recompute_bytes"] = predicted_peak(
                            name, depth, shape, True
                        )
                    del model, once
                    switch = None  # it holds the model: the next row's peak must not see it
                row["measured_block_s"] = (row["t4_s"] - row["t2_s"]) / 2
                row["recompute_overhead_meas"] = row["t4_recompute_s"] / row["t4_s"] - 1
            except torch.OutOfMemoryError as error:
                row["error"] = f"out of memory: {str(error).splitlines()[0][:200]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


class PathsTaken:
    """Counts the attention kernels a pass actually runs (``varlen_attention`` may send
    long segments to SDPA and the rest to the varlen kernel): wraps each kernel of
    ``attention._KERNELS`` while in use."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._saved: dict[str, Callable[..., torch.Tensor]] = {}

    def __enter__(self) -> PathsTaken:
        kernels = attention_module._KERNELS
        self._saved = dict(kernels)
        for name, kernel in self._saved.items():
            kernels[name] = functools.partial(self._run, name, kernel)
        return self

    def _run(self, name: str, kernel: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        self.calls[name] = self.calls.get(name, 0) + 1
        return kernel(*args)

    def __exit__(self, *exc: object) -> None:
        attention_module._KERNELS.update(self._saved)

    def path(self) -> str:
        """The one path taken, or the paths joined by ``+`` when a pass mixed them."""
        return "+".join(sorted(self.calls)) or "none"


def packed(device: torch.device, timer: Timer, cases: list) -> list[dict[str, Any]]:
    rows = []
    for name, one, short, count in cases:
        torch.manual_seed(0)
        model = build_model(name, device=device, num_layers=4)
        row: dict[str, Any] = {"model": name}
        for label, shapes in (("one", [one]), ("many", [short] * count)):
            dataset = dataset_of(shapes)
            with PathsTaken() as taken:
                seconds = timer(pass_fn(model, dataset, device))
            row[label] = {
                "n": len(shapes),
                "tokens": sum(s.tokens for s in shapes),
                "grid": shapes[0].grid,
                "measured_s": seconds,
                "attention_path": taken.path(),  # what ran, not what is preferred
                "attention_calls": taken.calls,
            }
        row["many_over_one_measured"] = row["many"]["measured_s"] / row["one"]["measured_s"]
        row["attention_path"] = row["many"]["attention_path"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del model
    return rows


#: attention-only layouts: (label, segment lengths, heads, kv heads, head dim, causal)
ATTENTION_CASES = [
    ("228 clips x 144", [144] * 228, 24, 24, 64, False),
    ("64 docs x 512, causal", [512] * 64, 32, 32, 128, True),
    ("1 x 32768, causal", [32768], 32, 32, 128, True),
    ("1 x 32768", [32768], 24, 24, 64, False),
    ("4 x 8192, causal, GQA 32/8", [8192] * 4, 32, 8, 128, True),
]
SMOKE_ATTENTION_CASES = [
    ("8 x 16", [16] * 8, 4, 4, 16, False),
    ("2 x 24, causal", [24] * 2, 4, 2, 16, True),
]


def attend(qkv: tuple, cu_seqlens: torch.Tensor, causal: bool, path: str) -> None:
    """One forward + backward of attention alone on ``path``."""
    out = attention_module.varlen_attention(*qkv, cu_seqlens, causal, path=path)
    out.sum().backward()


def attention_paths(device: torch.device, timer: Timer, smoke: bool) -> list[dict[str, Any]]:
    """Forward + backward of attention alone on every path the device has, per layout."""
    dtype = torch.float32 if smoke else torch.bfloat16
    rows = []
    for label, lengths, heads, kv_heads, head_dim, causal in (
        SMOKE_ATTENTION_CASES if smoke else ATTENTION_CASES
    ):
        total = sum(lengths)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        cu_seqlens = torch.tensor(offsets).to(device)
        cu_seqlens.host_offsets = tuple(offsets)  # as PackedBatch.to keeps them
        q, k, v = (
            torch.randn(total, h, head_dim, device=device, dtype=dtype, requires_grad=True)
            for h in (heads, kv_heads, kv_heads)
        )
        for path in attention_module.available_paths(q):
            if path == "flex" and device.type != "cuda":
                continue  # FlexAttention has no CPU backward

            once = functools.partial(attend, (q, k, v), cu_seqlens, causal, path)
            row = {"case": label, "path": path, "segments": len(lengths), "tokens": total}
            row.update(heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal)
            row["dtype"] = str(dtype).removeprefix("torch.")
            try:
                row["fwd_bwd_s"] = timer(once)
            except torch.OutOfMemoryError as error:
                row["error"] = f"out of memory: {str(error).splitlines()[0][:200]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_bench.json"), help="JSON report")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (tests)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per measurement")
    parser.add_argument(
        "--only", nargs="+", choices=("block_times", "packed", "attention"), help="a subset"
    )
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device; use --smoke for the CPU smoke mode", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    timer = Timer(device, max(1, args.repeats))
    wanted = set(args.only or ("block_times", "packed", "attention"))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "date": date.today().isoformat(),
        "mode": "cpu-smoke" if args.smoke else "gpu",
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.machine(),
        "torch": torch.__version__,
    }
    if "block_times" in wanted:
        cases = SMOKE_BLOCK_CASES if args.smoke else BLOCK_CASES
        report["block_times"] = block_times(device, timer, cases)
    if "packed" in wanted:
        report["packed"] = packed(device, timer, SMOKE_PACKED_CASES if args.smoke else PACKED_CASES)
    if "attention" in wanted:
        report["attention"] = attention_paths(device, timer, args.smoke)
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
