"""``torch.profiler`` traces (and CUDA memory snapshots) of chosen optimizer steps.

The ``[profiling]`` settings name the steps (``trace_steps``, numbered from 1 as the
log line numbers them); :class:`StepTracer` profiles each of them on the chosen ranks
and writes, under ``<out>/traces/``:

- ``step-N-rankR.json``: a Chrome trace (open it in Perfetto or ``chrome://tracing``;
  ``json.load`` reads it, events under ``traceEvents``);
- on CUDA with ``memory_snapshot``: ``memory-step-N-rankR.pickle``, the caching
  allocator's history over the step (drag it into pytorch.org/memory_viz).

This is PyTorch's own profiler, not the cost profiler of ``datacentric profile``
(``[cost]``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from datacentric.train.reporting.metric_sinks import logger

#: Allocation events the CUDA memory history keeps (the newest ones).
MEMORY_HISTORY_ENTRIES = 100_000


class StepTracer:
    """Profiles the steps ``steps`` (1-based) of one rank; call :meth:`begin` before a
    step runs and :meth:`end` after its optimizer step. ``run_steps``: the steps this
    run runs; rank 0 warns once about traced steps outside them."""

    def __init__(
        self,
        out_dir: str | Path,
        steps: tuple[int, ...],
        *,
        rank: int,
        device: torch.device,
        enabled: bool = True,
        memory_snapshot: bool = True,
        run_steps: range | None = None,
    ) -> None:
        self.folder = Path(out_dir) / "traces"
        self.steps = set(steps) if enabled else set()
        outside = sorted(s for s in self.steps if run_steps is not None and s not in run_steps)
        if outside and rank == 0 and run_steps is not None:  # once, then the run goes on
            logger.warning(
                "profiling.trace_steps %s: this run runs steps %d to %d; no trace for %s",
                list(steps), run_steps.start, run_steps.stop - 1,
                ", ".join(f"step {s}" for s in outside),
            )  # fmt: skip
        self.rank = rank
        self.cuda = device.type == "cuda"
        self.memory_snapshot = memory_snapshot and self.cuda
        self._profiler: torch.profiler.profile | None = None

    def begin(self, step: int) -> None:
        """Start profiling if ``step`` is one of the traced steps."""
        if step not in self.steps:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if self.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self._profiler.__enter__()

    def end(self, step: int) -> list[Path]:
        """Stop profiling ``step`` and write its files (returns their paths)."""
        if self._profiler is None:
            return []
        if self.cuda:
            torch.cuda.synchronize()
        self._profiler.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / f"step-{step}-rank{self.rank}.json"
        self._profiler.export_chrome_trace(str(trace))
        self._profiler = None
        written = [trace]
        if self.memory_snapshot:
            snapshot = self.folder / f"memory-step-{step}-rank{self.rank}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            written.append(snapshot)
        logger.info("step %d traced: %s", step, ", ".join(str(p) for p in written))
        return written

    def close(self) -> None:
        """Stop a profile left open by a failed step (nothing is written)."""
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None
            if self.memory_snapshot:
                torch.cuda.memory._record_memory_history(enabled=None)
