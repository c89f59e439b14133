"""Per-iteration metrics: JSON lines, a rank-0 progress bar, TensorBoard when installed.

:class:`StepMetrics` adds what users watch at scale to every record: ``grad_norm``
(what ``clip_grad_norm_`` returns: the whole gradient's norm before clipping),
``peak_memory_bytes`` (CUDA: the step's peak allocated; CPU: the process's peak
resident set so far), ``optimizer_state_bytes`` (this rank's share under the
``shard`` setting) and ``mfu``: the analytic model FLOPs of the step
(``6 * params * tokens`` for the linear layers plus the analytic attention FLOPs of
every micro-batch, forward and backward, without recomputation) over the step's
time, the world size and the hardware preset's peak (``h100-sxm``/``h200-sxm`` bf16
dense peak on CUDA, the calibrated ``cpu-local`` preset's fp32 peak on the CPU);
``None`` for models without an analytic spec.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm import tqdm

from datacentric.parallel.grad_sync import is_fsdp2
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.runtime import unwrap

if TYPE_CHECKING:
    from datacentric.train.config import TrainConfig
    from datacentric.train.data_centric import DataCentric, Step

#: Scalars of a record that go to TensorBoard.
TB_SCALARS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "peak_memory_bytes",
    "optimizer_state_bytes",
    "data_wait_s",
    "iteration_time_s",
    "est_idle_share",
    "measured_idle_share",
)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict, whatever holds it (collective under FSDP2)."""
    if is_fsdp2(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return unwrap(model).state_dict()


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of every tensor in a nested state (a DTensor's local shard)."""
    if isinstance(tensors, dict):
        return sum(local_bytes(v) for v in tensors.values())
    if isinstance(tensors, list | tuple):
        return sum(local_bytes(v) for v in tensors)
    if isinstance(tensors, torch.Tensor):
        local = tensors.to_local() if hasattr(tensors, "to_local") else tensors
        return local.numel() * local.element_size()
    return 0


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: peak allocated since the last :func:`torch.cuda.reset_peak_memory_stats`;
    CPU: the process's peak resident set (Linux reports KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class StepMetrics:
    """The per-step numbers beyond loss and speed (see the module docstring)."""

    def __init__(self, config: TrainConfig, dc: DataCentric, groups: ProcessGroups) -> None:
        from datacentric.models.presets import MODEL_PRESETS
        from datacentric.train.build import build_cost_model

        self.groups = groups
        self.shapes = dc.pipeline.shapes
        self.analytic = (
            build_cost_model(config.model, groups.device, config.dtype)
            if config.model in MODEL_PRESETS
            else None
        )

    def start(self) -> None:
        """Open a step (resets CUDA's peak-memory counter)."""
        if self.groups.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.groups.device)

    def model_flops(self, step: Step) -> float | None:
        """Analytic FLOPs of the step's forward and backward over all ranks."""
        if self.analytic is None:
            return None
        params = self.analytic.spec.num_params
        flops = 0.0
        for assignment in step.iteration.assignments:
            for mb in assignment.micro_batches:
                shapes = [self.shapes[i] for i in mb.sample_ids]
                flops += 6.0 * params * sum(s.tokens for s in shapes)
                flops += self.analytic.work(shapes, 1, ()).attention_flops
        return flops

    def record(
        self,
        step: Step,
        grad_norm: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        tokens: int,
        elapsed_s: float,
    ) -> dict[str, Any]:
        """This step's ``grad_norm``, ``mfu``, ``model_flops``, ``peak_memory_bytes`` and
        ``optimizer_state_bytes`` (this rank's)."""
        del tokens  # the FLOPs count every micro-batch's tokens themselves
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        flops = self.model_flops(step)
        peak = self.analytic.hardware.peak_flops if self.analytic is not None else None
        mfu = None
        if flops is not None and peak and elapsed_s > 0:
            mfu = flops / (elapsed_s * self.groups.world_size * peak)
        norm = float(grad_norm)
        return {
            "grad_norm": norm if math.isfinite(norm) else None,
            "mfu": mfu,
            "model_flops": flops,
            "peak_memory_bytes": peak_memory_bytes(self.groups.device),
            "optimizer_state_bytes": local_bytes(optimizer.state_dict()["state"]),
        }


class MetricsLogger:
    """Writes one JSON object per optimizer step to ``<out>/metrics.jsonl`` (rank 0 only).

    Appends, so a resumed run continues the same file. Also drives a progress bar
    and, when ``tensorboard`` is installed, TensorBoard scalars under ``<out>/tb``.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        enabled: bool,
        total: int | None,
        initial: int = 0,
        progress: bool = True,
    ) -> None:
        self.enabled = enabled
        self._file = None
        self._bar = None
        self._tb = None
        if not enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._file = open(out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        if progress:
            self._bar = tqdm(
                total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True
            )
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # noqa: BLE001 - tensorboard is optional
            SummaryWriter = None  # noqa: N806
        if SummaryWriter is not None:
            self._tb = SummaryWriter(log_dir=str(out / "tb"))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}"
            )
        if self._tb is not None:
            step = record["iteration"]
            for key in TB_SCALARS:
                if record.get(key) is not None:
                    self._tb.add_scalar(key, record[key], step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's ``metrics.jsonl`` (empty if none)."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
