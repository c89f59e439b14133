"""GPU readiness check: one device, no NCCL collectives, a short table and a JSON report.

Checks, each independent (one failing does not stop the others):

- ``attention``: ``varlen_attention`` (flash-attn when installed, else SDPA per
  segment) against a float64 math reference, outputs and q/k/v gradients, in
  float32 and bfloat16; on CUDA also under each SDPA backend;
- ``llama`` / ``dit``: forward + backward of the presets under bf16 autocast,
  loss against float32, finite non-zero gradients, the dtype attention sees;
- ``memory``: peak bytes of one pass (``torch.cuda.max_memory_allocated`` via
  ``planning.memory.measure_peak``) plus model states, against the analytic
  planner's ``pass_memory_bytes``, without and with recomputation;
- ``profile``: the dual-layer profile of one micro-batch through
  ``planning.profiler.measure`` in a world of one rank (NCCL on CUDA, which with
  one rank moves no data; gloo on CPU), fitted into a ``ProfilePoint``;
- ``train-step``: one iteration (two accumulated micro-batches, one recomputed)
  through ``DataCentricRuntime`` with ``ProcessGroups.local``: float32 gradients
  against one single-pass reference, then a bf16-autocast step and AdamW;
- ``hf``: the Hugging Face Llama adapter, forward + backward under autocast
  (when ``transformers`` is installed).

    python benchmarks/gpu_check.py --out runs/gpu_check.json      # on a CUDA machine
    python benchmarks/gpu_check.py --device cpu --out check.json  # CPU smoke mode

Exit status: 0 when no check failed, 1 when one did, 2 when no GPU is present
(and ``--device cpu`` was not given). Shape legend: S tokens, H heads, D head dim.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from datacentric.batch import PackedBatch
from datacentric.data import SyntheticTextDataset, SyntheticVideoDataset
from datacentric.models import attention as attention_module
from datacentric.models.attention import math_attention, varlen_attention
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.loss import LossWeights, loss_tokens_function
from datacentric.parallel.recompute import BlockRecompute, compile_blocks
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.profiling.factory import analytic_cost_model, get_model_spec
from datacentric.profiling.memory import measure_peak, model_state_bytes
from datacentric.schedule import Assignment, Iteration, MicroBatch
from datacentric.settings.sections import CostConfig
from datacentric.shapes import SampleShape
from datacentric.verify.equivalence import relative_errors

ATTENTION_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
"""Largest accepted ``max |x - ref| / max |ref|`` per dtype (outputs and gradients)."""


@dataclass(frozen=True)
class Scale:
    """Problem sizes of one mode (a real GPU, or the quick CPU smoke mode)."""

    segments: tuple[int, ...]
    heads: int
    head_dim: int
    text: tuple[int, ...]
    video: tuple[tuple[int, int, int], ...]
    profile_tokens: int
    repeats: int


GPU_SCALE = Scale(
    (1000, 77, 3001, 4096), 8, 128, (2048, 1024, 512), ((4, 16, 16), (1, 32, 32)), 2048, 3
)
CPU_SCALE = Scale((17, 40, 5), 4, 16, (96, 48, 33), ((1, 4, 6), (2, 4, 4)), 64, 1)


@dataclass
class CheckResult:
    """The outcome of one check: ``pass``, ``warn`` (a number to look at), ``fail`` or ``skip``."""

    name: str
    status: str
    seconds: float
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_check(name: str, check: Callable[[], tuple[str, str, dict[str, Any]]]) -> CheckResult:
    """Run one check; an exception is a ``fail`` with the error as detail."""
    start = time.perf_counter()
    try:
        status, detail, data = check()
    except Exception as error:  # noqa: BLE001 - every failure is reported, the rest still run
        status, detail = "fail", f"{type(error).__name__}: {error}".splitlines()[0][:160]
        data = {"traceback": traceback.format_exc()}
    return CheckResult(name, status, round(time.perf_counter() - start, 3), detail, data)


# --- attention --------------------------------------------------------------------------


def attention_errors(
    device: torch.device,
    dtype: torch.dtype,
    scale: Scale,
    causal: bool = True,
    *,
    path: str | None = None,
    kv_heads: int | None = None,
    window: int | None = None,
    segments: tuple[int, ...] | None = None,
    heads: int | None = None,
) -> dict[str, float]:
    """Relative max errors of ``varlen_attention`` (on ``path``, default: its own
    choice) vs :func:`math_attention` in float64."""
    gen = torch.Generator().manual_seed(0)
    segments, heads = segments or scale.segments, heads or scale.heads
    total = sum(segments)
    cu_seqlens = torch.tensor([0, *torch.tensor(segments).cumsum(0).tolist()])
    shape = (total, heads, scale.head_dim)
    kv_shape = (total, kv_heads or heads, scale.head_dim)
    qkv = [torch.randn(s, generator=gen) for s in (shape, kv_shape, kv_shape)]
    grad_out = torch.randn(shape, generator=gen)
    ours = [t.to(device, dtype, copy=True).requires_grad_() for t in qkv]
    cu_device = cu_seqlens.to(device)
    cu_device.host_offsets = tuple(cu_seqlens.tolist())  # as PackedBatch.to keeps them
    out = varlen_attention(*ours, cu_device, causal, window=window, path=path)
    out.backward(grad_out.to(device, dtype))
    ref = [t.to(device, torch.float64, copy=True).requires_grad_() for t in qkv]
    ref_out = math_attention(*ref, cu_seqlens.to(device), causal, window=window)
    ref_out.backward(grad_out.to(device, torch.float64))

    def rel(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((x.double() - y).abs().max() / y.abs().max())

    errors = {"out": rel(out.detach(), ref_out.detach())}
    for name, mine, theirs in zip(("dq", "dk", "dv"), ours, ref):
        errors[name] = rel(mine.grad, theirs.grad)
    return errors


def check_attention(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    """Every attention path this device has, fp32 where the path takes it and bf16,
    plain, with grouped K/V heads and with a sliding window (FlexAttention's backward
    exists only on CUDA, so on the CPU it is left out)."""
    probe = torch.zeros(1, device=device)
    data: dict[str, Any] = {
        "default_path": attention_module.attention_path(probe.to(torch.bfloat16)),
        "segments": scale.segments,
    }
    variants = {"plain": {}, "gqa": {"kv_heads": scale.heads // 2}, "window": {"window": 64}}
    worst_ok, worst = True, {}
    for dtype in (torch.float32, torch.bfloat16):
        for path in attention_module.available_paths(probe.to(dtype)):
            if path == "flex" and device.type != "cuda":
                continue
            for variant, kwargs in variants.items():
                key = f"{path}/{str(dtype).removeprefix('torch.')}/{variant}"
                errors = attention_errors(device, dtype, scale, path=path, **kwargs)
                data[key] = errors
                worst[key] = max(errors.values())
                worst_ok &= worst[key] <= ATTENTION_TOLERANCE[dtype]
    if device.type == "cuda":  # the default choice: a long segment by SDPA, the rest varlen
        split = {"segments": (7200, 300, 50), "heads": 32}
        q = torch.zeros(sum(split["segments"]), 32, scale.head_dim, device=device)
        cu = torch.tensor([0, 7200, 7500, 7550])
        data["split_long_segments"] = attention_module._long_segments(q, cu, True)
        errors = attention_errors(device, torch.bfloat16, scale, **split)
        data["default/bfloat16/split"] = errors
        worst["default/bfloat16/split"] = max(errors.values())
        worst_ok &= worst["default/bfloat16/split"] <= ATTENTION_TOLERANCE[torch.bfloat16]
        worst_ok &= data["split_long_segments"] == [0]
    f32 = max(v for k, v in worst.items() if "/float32/" in k)
    bf16 = max(v for k, v in worst.items() if "/bfloat16/" in k)
    paths = sorted({k.split("/")[0] for k in worst})
    detail = f"max rel err fp32 {f32:.1e}, bf16 {bf16:.1e} (paths {', '.join(paths)})"
    return ("pass" if worst_ok else "fail"), detail, data


# --- model passes -----------------------------------------------------------------------


def preset_dataset(name: str, scale: Scale) -> SyntheticTextDataset | SyntheticVideoDataset:
    """Synthetic samples of the scale's shapes for preset ``name``."""
    if name.startswith("dit"):
        return SyntheticVideoDataset([SampleShape.video(*g) for g in scale.video], seed=0)
    return SyntheticTextDataset([SampleShape.text(n) for n in scale.text], seed=0)


def preset_batch(name: str, device: torch.device, scale: Scale) -> tuple[Any, PackedBatch]:
    """:func:`preset_dataset` and all of its samples packed into one batch on ``device``."""
    dataset = preset_dataset(name, scale)
    return dataset, dataset.pack(list(range(len(dataset))), 1).to(device)


def mean_loss(model: torch.nn.Module, dataset: Any, batch: PackedBatch) -> torch.Tensor:
    """The batch's loss as training defines it (``LossWeights``: token or sample mean)."""
    weights = LossWeights.for_samples(
        model.loss_mode, batch.sample_ids, loss_tokens_function(dataset)
    )
    return weights.weighted_sum(model(batch), batch)


def check_preset(name: str, device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    dataset, batch = preset_batch(name, device, scale)
    torch.manual_seed(0)
    model = build_model(name, device=device)
    seen: list[torch.dtype] = []

    def recording(q_SHD, k_SHD, v_SHD, cu_seqlens, causal):  # noqa: ANN001, ANN202
        seen.append(q_SHD.dtype)
        return varlen_attention(q_SHD, k_SHD, v_SHD, cu_seqlens, causal)

    model.set_attention(recording)
    with torch.no_grad():
        loss32 = float(mean_loss(model, dataset, batch))
    seen.clear()
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        loss = mean_loss(model, dataset, batch)
    loss.backward()
    synchronize(device)
    elapsed = time.perf_counter() - start
    loss_bf16 = loss.item()
    grads = [p.grad for p in model.parameters()]
    finite = all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    nonzero = sum(1 for g in grads if g is not None and bool(g.abs().sum() > 0))
    rel = abs(loss_bf16 - loss32) / abs(loss32)
    data = {
        "tokens": batch.num_tokens,
        "loss_bf16": loss_bf16,
        "loss_fp32": loss32,
        "rel_loss_diff": rel,
        "attention_dtypes": sorted({str(d).removeprefix("torch.") for d in seen}),
        "grads_finite": finite,
        "params_with_grad": f"{nonzero}/{len(grads)}",
        "fwd_bwd_s": elapsed,
    }
    bf16_attention = bool(seen) and all(d == torch.bfloat16 for d in seen)
    ok = finite and nonzero == len(grads) and rel < 5e-2 and bf16_attention
    detail = (
        f"{batch.num_tokens} tok, loss bf16 {loss_bf16:.4f} vs fp32 {loss32:.4f}, "
        f"attn {'/'.join(data['attention_dtypes'])}, {elapsed * 1e3:.0f} ms"
    )
    return ("pass" if ok else "fail"), detail, data


def check_memory(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    dataset, batch = preset_batch("llama", device, scale)
    torch.manual_seed(0)
    model = build_model("llama", device=device)
    # Memory does not depend on the hardware preset; float32 states and activations.
    planner = analytic_cost_model(get_model_spec("llama"), "h100-sxm", dtype_bytes=4)
    blocks = len(model.blocks)
    data: dict[str, Any] = {
        "tokens": batch.num_tokens,
        "model_state_bytes": model_state_bytes(model),
    }
    ratios = []
    switch = BlockRecompute.apply(model)

    def one_pass() -> None:
        mean_loss(model, dataset, batch).backward()

    for label, recompute in (("none", (False,) * blocks), ("all", (True,) * blocks)):
        with switch.use(recompute):
            one_pass()  # allocates the gradients (first time) and warms up
            peak, _ = measure_peak(device, one_pass)
        measured = peak + model_state_bytes(model)
        predicted = planner.pass_memory_bytes(dataset.shapes(), 1, recompute)
        ratios.append(measured / predicted)
        data[f"recompute_{label}"] = {
            "measured_bytes": measured,
            "activation_peak_bytes": peak,
            "predicted_bytes": predicted,
            "measured_over_predicted": measured / predicted,
        }
    if device.type == "cuda":
        data["max_memory_allocated"] = int(torch.cuda.max_memory_allocated(device))
    detail = "measured/predicted " + ", ".join(
        f"{label} {r:.2f}" for label, r in zip(("no recompute", "recompute"), ratios)
    )
    status = "pass" if all(0.75 <= r <= 1.25 for r in ratios) else "warn"
    return status, detail, data


def check_profile(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    if importlib.util.find_spec("datacentric.profiling.profiler") is None:
        return "skip", "datacentric.profiling.profiler is not available", {}
    import torch.distributed as dist

    from datacentric.profiling.profiler import (
        ProfileSettings,
        dual_layer_cases,
        measure,
        point_from_runs,
    )

    backend = "nccl" if device.type == "cuda" else "gloo"
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    settings = ProfileSettings(
        model="llama",
        world_size=1,
        backend=backend,
        dtype=dtype,
        cost=CostConfig(repeats=scale.repeats, threads_per_rank=None),
    )
    cases = dual_layer_cases([SampleShape.text(scale.profile_tokens)], 1)
    started_world = not dist.is_initialized()
    if started_world:  # a world of one rank, in this process: measure() runs here
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        results = measure(cases, settings)
    finally:
        if started_world:
            dist.destroy_process_group()
    point = point_from_runs(results)
    data = {"backend": backend, "dtype": dtype, "point": point.to_json()}
    data["runs"] = [
        {
            "depth": r.case.depth,
            "recompute": r.case.recompute,
            "time_s": r.time_s,
            "memory_bytes": r.memory_bytes,
        }
        for r in results
    ]
    ok = all(r.time_s > 0 and r.memory_bytes > 0 for r in results) and point.block_memory_bytes > 0
    detail = (
        f"{scale.profile_tokens} tok: block {point.block_time_s * 1e3:.2f} ms, "
        f"{point.block_memory_bytes / 2**20:.1f} MiB/block, base {point.base_time_s * 1e3:.2f} ms"
    )
    return ("pass" if ok else "fail"), detail, data


def check_train_step(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    dataset = preset_dataset("llama", scale)
    ids = list(range(len(dataset)))
    blocks = len(build_model("llama", device="meta").blocks)
    micro = (
        MicroBatch(tuple(ids[:1]), "check", dataset.shapes()[0].tokens, (True,) * blocks),
        MicroBatch(tuple(ids[1:]), "check", sum(s.tokens for s in dataset.shapes()[1:])),
    )
    iteration = Iteration(index=0, assignments=(Assignment(0, 1, micro),))
    groups = ProcessGroups.local(device=device)

    def runtime_for() -> DataCentricRuntime:
        torch.manual_seed(0)
        model = build_model("llama", device=device)
        return DataCentricRuntime(model, groups, dataset.pack, loss_tokens_function(dataset))

    runtime = runtime_for()
    stats = run_step(runtime, iteration).stats
    loss = runtime.global_loss(stats)
    grads = {n: p.grad.detach().clone() for n, p in runtime.module.named_parameters()}
    torch.manual_seed(0)
    reference = build_model("llama", device=device)
    ref_loss = mean_loss(reference, dataset, dataset.pack(ids, 1).to(device))
    ref_loss.backward()
    errors = relative_errors(grads, {n: p.grad for n, p in reference.named_parameters()})
    grad_err = max(errors.values())
    tolerance = 1e-4 if device.type == "cuda" else 1e-5

    optimizer = torch.optim.AdamW(runtime.module.parameters(), lr=1e-3)
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        bf16_stats = run_step(runtime, iteration).stats
    optimizer.step()
    synchronize(device)
    elapsed = time.perf_counter() - start
    bf16_loss = runtime.global_loss(bf16_stats)
    data = {
        "loss_fp32": loss,
        "loss_reference": ref_loss.item(),
        "max_rel_grad_err_fp32": grad_err,
        "tolerance": tolerance,
        "loss_bf16": bf16_loss,
        "bf16_step_s": elapsed,
        "tokens_per_s_bf16": iteration.num_tokens / elapsed,
        "micro_batch_s": [mb.time_s for mb in bf16_stats.micro_batches],
    }
    ok = grad_err <= tolerance and math.isfinite(bf16_loss) and abs(bf16_loss - loss) < 5e-2 * loss
    detail = (
        f"fp32 grad err {grad_err:.1e} vs one pass, bf16 loss {bf16_loss:.4f}, "
        f"{data['tokens_per_s_bf16']:.0f} tok/s"
    )
    return ("pass" if ok else "fail"), detail, data


def check_host_sync(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    """Host synchronisations while one iteration's micro-batches run (CUDA's sync
    debug mode): the runtime should queue every micro-batch without waiting and read
    losses and times once, in ``finish_iteration``."""
    if device.type != "cuda":
        return "skip", "CUDA only: the CPU has no device queue to stall", {}
    dataset = preset_dataset("llama", scale)
    blocks = len(build_model("llama", device="meta").blocks)
    micro = tuple(
        MicroBatch((i,), "check", shape.tokens, (True,) * blocks if i == 1 else ())
        for i, shape in enumerate(dataset.shapes())
    )
    iteration = Iteration(index=0, assignments=(Assignment(0, 1, micro),))
    torch.manual_seed(0)
    model = build_model("llama", device=device)
    runtime = DataCentricRuntime(
        model, ProcessGroups.local(device=device), dataset.pack, loss_tokens_function(dataset)
    )
    run_step(runtime, iteration)  # warm-up: kernels chosen, pinned host blocks cached
    synchronize(device)
    stats = runtime.start_iteration(iteration)
    syncs: list[str] = []  # the Python stack of each, innermost first

    running = False

    def record(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
        if running and "synchroniz" in str(message):
            frames = traceback.extract_stack()[:-1][-8:]
            syncs.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        running = True  # (setting the mode itself warns once)
        try:
            for step in runtime.micro_steps(iteration, stats):
                step.backward(runtime.model(step.batch))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    runtime.finish_iteration(stats)
    where = sorted(set(syncs))
    data = {"micro_batches": len(micro), "host_syncs": len(syncs), "where": where}
    detail = f"{len(syncs)} host syncs over {len(micro)} micro-batches" + (
        f" at {where[0]}" if where else ""
    )
    return ("pass" if not syncs else "warn"), detail, data


def check_compile(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    """``torch.compile`` of every block (the ``compile`` setting's unit) against eager:
    the loss and every gradient, float32."""
    dataset, batch = preset_batch("llama", device, scale)
    losses, grads = [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = build_model("llama", device=device)
        if compiled:  # what the ``compile`` setting does
            compile_blocks(model, "inductor" if device.type == "cuda" else "aot_eager")
        loss = mean_loss(model, dataset, batch)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    grad_err = max(relative_errors(grads[1], grads[0]).values())
    loss_err = abs(losses[1] - losses[0]) / abs(losses[0])
    ok = grad_err <= 1e-3 and loss_err <= 1e-4
    data = {"loss_eager": losses[0], "loss_compiled": losses[1], "max_rel_grad_err": grad_err}
    detail = f"compiled blocks vs eager: loss rel {loss_err:.1e}, grad rel {grad_err:.1e}"
    return ("pass" if ok else "fail"), detail, data


def check_hf(device: torch.device, scale: Scale) -> tuple[str, str, dict[str, Any]]:
    if importlib.util.find_spec("transformers") is None:
        return "skip", "transformers is not installed", {}
    from datacentric.models.hf import build_hf_llama

    dataset, batch = preset_batch("llama", device, scale)
    torch.manual_seed(0)
    model = build_hf_llama(device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        loss = mean_loss(model, dataset, batch)
    loss.backward()
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    detail = (
        f"{batch.num_tokens} tok, loss {loss.item():.4f} (bf16 autocast), grads finite: {finite}"
    )
    ok = finite and math.isfinite(loss.item())
    return ("pass" if ok else "fail"), detail, {"loss": loss.item(), "grads_finite": finite}


# --- driver -----------------------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and the device, for the report."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "cuda_available": torch.cuda.is_available(),
        "flash_attn": attention_module._flash_varlen is not None,
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["bf16_supported"] = torch.cuda.is_bf16_supported()
        nccl = torch.cuda.nccl.version()  # a tuple, or an int in older releases
        env["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return env


CHECKS: dict[str, Callable[[torch.device, Scale], tuple[str, str, dict[str, Any]]]] = {
    "attention": check_attention,
    "llama": lambda device, scale: check_preset("llama", device, scale),
    "dit": lambda device, scale: check_preset("dit", device, scale),
    "memory": check_memory,
    "profile": check_profile,
    "train-step": check_train_step,
    "host-sync": check_host_sync,
    "compile": check_compile,
    "hf": check_hf,
}


def format_table(results: Sequence[CheckResult]) -> str:
    """One line per check: name, status, seconds, detail."""
    lines = [f"{'check':<11} {'status':<6} {'s':>7}  detail", "-" * 100]
    for r in results:
        lines.append(f"{r.name:<11} {r.status:<6} {r.seconds:7.2f}  {r.detail}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check datacentric on one GPU (or CPU smoke).")
    parser.add_argument(
        "--device", default="cuda", help="cuda (default; needs a GPU) or cpu (smoke mode)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), help="run only these")
    parser.add_argument("--threads", type=int, default=None, help="CPU intra-op threads")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(
                "gpu_check: no CUDA GPU is available here (torch "
                f"{torch.__version__}, cuda {torch.version.cuda}); nothing was checked. "
                "Run with --device cpu for the CPU smoke mode of the same code paths.",
                file=sys.stderr,
            )
            return 2
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = GPU_SCALE if device.type == "cuda" else CPU_SCALE
    names = args.only or list(CHECKS)
    results = []
    for name in names:
        results.append(run_check(name, lambda n=name: CHECKS[n](device, scale)))
        done = results[-1]  # as it finishes, so a run cut short still shows it
        line = f"{name}: {done.status} {done.seconds:.1f} s  {done.detail}"
        print(line, file=sys.stderr, flush=True)
    print(format_table(results))
    failed = [r.name for r in results if r.status == "fail"]
    report = {
        "environment": environment(device),
        "mode": "gpu" if device.type == "cuda" else "cpu-smoke",
        "scale": asdict(scale),
        "checks": [asdict(r) for r in results],
        "failed": failed,
        "passed": not failed,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"report: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
