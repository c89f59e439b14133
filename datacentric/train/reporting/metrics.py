"""Per-iteration metrics: what a step record holds beyond loss and speed.

The sinks the records go to (``metrics.jsonl``, the log line, TensorBoard, W&B) are in
:mod:`datacentric.train.reporting.metric_sinks` (``MetricsLogger`` is re-exported here).

:class:`StepMetrics` adds what users watch at scale to every record: ``grad_norm``
(what ``clip_grad_norm_`` returns: the whole gradient's norm before clipping),
``peak_memory_bytes`` (CUDA: the step's peak allocated; CPU: the process's peak
resident set so far), ``optimizer_state_bytes`` (this rank's share under the
``shard`` setting) and ``mfu``: the analytic model FLOPs of the step
(``6 * params * tokens`` for the linear layers plus three times the analytic attention
forward FLOPs of every micro-batch: forward and backward, without recomputation) over the step's
time, the world size and the hardware preset's peak (``h100-sxm``/``h200-sxm`` bf16
dense peak on CUDA, the calibrated ``cpu-local`` preset's fp32 peak on the CPU). Any
model's spec is read by :func:`~datacentric.profiling.factory.named_spec` (from
its parameter shapes where nothing better is known, approximate); ``None`` for a model
whose cost cannot be read.
"""

from __future__ import annotations

import json
import math
import resource
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from datacentric.parallel.grad_sync import is_fsdp2
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.runtime import unwrap
from datacentric.regular_files import read_regular_text
from datacentric.scheduling.measures import iteration_imbalance
from datacentric.shapes import SampleShape
from datacentric.train.reporting.metric_sinks import SCALARS as TB_SCALARS  # noqa: F401
from datacentric.train.reporting.metric_sinks import (
    MetricsLogger,  # noqa: F401
    logger,
)
from datacentric.train.reporting.timeline import gather_spans, timeline_json

if TYPE_CHECKING:
    from datacentric.planning.cost_model import CostModel
    from datacentric.train.data_centric import DataCentric, Step


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict, whatever holds it (collective under FSDP2), each
    aliased tensor once, as a checkpoint stores it."""
    from datacentric.train.checkpoints.state_names import without_aliases

    if is_fsdp2(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        return without_aliases(model, state)
    return without_aliases(model, unwrap(model).state_dict())


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

    def __init__(self, dc: DataCentric, groups: ProcessGroups, analytic: CostModel | None) -> None:
        self.groups = groups
        self.shapes = dc.pipeline.shapes
        self.analytic = analytic
        """The analytic model the step's FLOPs are counted on (``None``: ``mfu`` is None;
        :func:`~datacentric.train.build.mfu_cost_model`)."""

    def start(self) -> None:
        """Open a step (resets CUDA's peak-memory counter)."""
        if self.groups.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.groups.device)

    def model_flops(self, step: Step) -> float | None:
        """Analytic FLOPs of the step's forward and backward over all ranks, by the usual
        MFU convention: ``6 x parameters`` per token for the matmuls, and attention's
        forward FLOPs three times (backward counted as twice forward); recomputation is
        not counted, so the figure does not depend on the plan."""
        if self.analytic is None:
            return None
        params = self.analytic.spec.num_params
        flops = 0.0
        for assignment in step.iteration.assignments:
            for mb in assignment.micro_batches:
                shapes = [self.shapes[i] for i in mb.sample_ids]
                flops += 6.0 * params * sum(s.tokens for s in shapes)
                flops += 3.0 * self.analytic.work(shapes, 1, ()).attention_flops
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


def step_record(
    step: Step,
    loss: float,
    lr: float,
    grad_norm: torch.Tensor,
    elapsed: float,
    *,
    metrics: StepMetrics,
    optimizer: torch.optim.Optimizer,
    shapes: list[SampleShape],
    loss_tokens: Callable[[int], int],
    timeline: bool,
) -> dict[str, Any]:
    """The ``metrics.jsonl`` record of a finished step: its loss, rate, learning rate,
    estimated and measured idle share, groups and waits, what ``metrics`` adds, the
    token metrics when the step has them and, with ``timeline``, every rank's spans
    (collective: every rank gathers them)."""
    iteration, sample_ids = step.iteration, step.sample_ids
    tokens = sum(shapes[i].tokens for i in sample_ids)
    busy = step.rank_compute_s
    wall = step.runtime_time_s
    groups = metrics.groups
    return {
        "iteration": step.number,
        "epoch": step.epoch,
        "loss": loss,
        "lr": lr,
        "samples": len(sample_ids),
        "tokens": tokens,
        "loss_tokens": sum(loss_tokens(i) for i in sample_ids),
        "iteration_time_s": elapsed,
        "tokens_per_s": tokens / elapsed,
        "est_makespan_s": iteration.est_makespan_s,
        "est_idle_share": iteration_imbalance(iteration, groups.world_size),
        "measured_idle_share": 1.0 - sum(busy) / (len(busy) * wall) if wall else 0.0,
        "groups": [
            [a.rank_start, a.sp_size, a.accumulation_steps]
            + ([a.phase] if iteration.num_phases > 1 else [])
            for a in iteration.assignments
        ],
        "rank_compute_s": busy,
        "runtime_time_s": wall,
        "data_wait_s": step.data_wait_s,
        "schedule_wait_s": step.schedule_wait_s,
        **metrics.record(step, grad_norm, optimizer, tokens, elapsed),
        **(
            {"mean_token_accuracy": step.token_accuracy, "entropy": step.entropy}
            if step.token_accuracy is not None
            else {}
        ),
        **({"timeline": timeline_json(gather_spans(step.stats, groups))} if timeline else {}),
    }


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's ``metrics.jsonl`` (empty if none; see :func:`read_jsonl`)."""
    return read_jsonl(Path(out_dir) / "metrics.jsonl")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file a run appends to (empty if it does not exist).

    A torn last line (the writer was killed mid-line) is skipped with a warning; any
    other line that is not a JSON object is a ``ValueError`` naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = read_regular_text(path, errors="replace").splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    records = []
    for n, line in numbered:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if n != numbered[-1][0]:
                raise ValueError(
                    f"{path}:{n} is not a JSON record ({err}); the file is corrupt"
                ) from None
            logger.warning(
                "%s:%d: skipped a torn last line (a run stopped while writing it)", path, n
            )
            continue
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{n} holds a {type(record).__name__}, not a JSON record")
        records.append(record)
    return records
