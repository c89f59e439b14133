"""Chrome / Perfetto trace of simulated schedules.

The file is the Trace Event Format's JSON object form (``{"traceEvents": [...]}``),
which both ``chrome://tracing`` and https://ui.perfetto.dev open. Layout: one
process per policy, one thread (track) per GPU. Each micro-batch is a complete
(``"X"``) slice on every rank of its group; inside it, two nested slices show the
*aggregate* time of its recomputation and of its all-to-all (in reality both are
spread over the layers; the model only knows their totals). After the slowest group
finishes, every rank gets a ``grad all-reduce`` slice for the exposed gradient sync.
Gaps on a track are idle time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from datacentric.sim.engine import MicroBatchSpan, SimResult

_US = 1e6  # trace timestamps are microseconds


def trace_events(
    results: Mapping[str, SimResult], max_iterations: int | None = None
) -> list[dict[str, Any]]:
    """Trace events of every policy's result (the first ``max_iterations`` iterations)."""
    events: list[dict[str, Any]] = []
    for pid, (policy, result) in enumerate(results.items()):
        events.append(_meta("process_name", pid, None, {"name": policy}))
        events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
        for rank in range(result.world_size):
            events.append(_meta("thread_name", pid, rank, {"name": f"GPU {rank}"}))
            events.append(_meta("thread_sort_index", pid, rank, {"sort_index": rank}))
        keep = {it.index for it in result.iterations[:max_iterations]}
        for span in result.spans:
            if span.iteration not in keep:
                continue
            for rank in span.ranks:
                events.extend(_micro_batch_events(pid, rank, span))
        for it in result.iterations[:max_iterations]:
            if it.grad_sync_s <= 0:
                continue
            for rank in range(result.world_size):
                events.append(
                    _slice(
                        "grad all-reduce",
                        "collective",
                        pid,
                        rank,
                        it.start_s + it.makespan_s,
                        it.grad_sync_s,
                        {"iteration": it.index, "world_size": result.world_size},
                    )
                )
    return events


def write_trace(
    results: Mapping[str, SimResult] | SimResult, path: str, max_iterations: int | None = None
) -> int:
    """Write a Perfetto-readable JSON trace to ``path``; returns the number of events."""
    if isinstance(results, SimResult):
        results = {results.policy: results}
    events = trace_events(results, max_iterations)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
    return len(events)


def _micro_batch_events(pid: int, rank: int, span: MicroBatchSpan) -> list[dict[str, Any]]:
    args = {
        "iteration": span.iteration,
        "group": f"ranks {span.rank_start}..{span.rank_start + span.sp_size - 1}",
        "sp_size": span.sp_size,
        "micro_batch": span.index,
        "samples": span.samples,
        "tokens": span.tokens,
        "memory_GiB": round(span.memory_bytes / 2**30, 3),
    }
    name = f"{span.bucket} x{span.samples} (sp {span.sp_size})"
    duration = span.end_s - span.start_s
    out = [_slice(name, "micro_batch", pid, rank, span.start_s, duration, args)]
    comm_start = span.end_s - span.comm_s
    if span.comm_s > 0:
        out.append(_slice("all-to-all (total)", "collective", pid, rank, comm_start, span.comm_s))
    if span.recompute_s > 0:
        start = comm_start - span.recompute_s
        out.append(_slice("recompute (total)", "recompute", pid, rank, start, span.recompute_s))
    return out


def _slice(
    name: str,
    category: str,
    pid: int,
    tid: int,
    start_s: float,
    duration_s: float,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "name": name,
        "cat": category,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": round(start_s * _US, 3),
        "dur": round(duration_s * _US, 3),
    }
    if args:
        event["args"] = args
    return event


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event
