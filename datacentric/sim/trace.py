"""Chrome / Perfetto trace of simulated or measured runs.

The file is the Trace Event Format's JSON object form (``{"traceEvents": [...]}``),
which both ``chrome://tracing`` and https://ui.perfetto.dev open. Layout: one
process per policy, one thread (track) per GPU. It is drawn from the result's
:class:`~datacentric.timing.Span` records alone: each micro-batch is a complete
(``"X"``) slice on every rank that ran it, enclosing its spans; inside it, nested
slices show the *aggregate* time of its recomputation and of its all-to-all (in
reality both are spread over the layers; the model only knows their totals).
Every ``sync`` span is a ``grad all-reduce`` slice, every ``idle`` span an ``idle``
slice. Gaps on a track are idle time.

Times are whole nanoseconds: each slice's start and end are rounded to integer
nanoseconds and ``ts``/``dur`` (microseconds, as the format wants) are derived from
those integers, so a slice that ends where its sibling starts never overlaps it.
Tracks are named by what ran: ``GPU n`` for simulated ranks, ``CPU rank n`` or
``CUDA rank n`` for measured ones (``SimResult.device``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from datacentric.sim.engine import MicroBatchRun, SimResult
from datacentric.timing import COMM, IDLE, RECOMPUTE, SYNC, Span

_NS = 1_000_000_000  # slices start and end on whole nanoseconds
_TRACK_NAMES = {"gpu": "GPU {}", "cpu": "CPU rank {}", "cuda": "CUDA rank {}"}
_NESTED = {
    RECOMPUTE: ("recompute (total)", "recompute"),
    COMM: ("all-to-all (total)", "collective"),
}


def trace_events(
    results: Mapping[str, SimResult], max_iterations: int | None = None
) -> list[dict[str, Any]]:
    """Trace events of every policy's result (the first ``max_iterations`` iterations)."""
    events: list[dict[str, Any]] = []
    for pid, (policy, result) in enumerate(results.items()):
        events.append(_meta("process_name", pid, None, {"name": policy}))
        events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
        for rank in range(result.world_size):
            label = _TRACK_NAMES.get(result.device, result.device + " rank {}").format(rank)
            events.append(_meta("thread_name", pid, rank, {"name": label}))
            events.append(_meta("thread_sort_index", pid, rank, {"sort_index": rank}))
        keep = {it.index for it in result.iterations[:max_iterations]}
        passes: dict[tuple[int, int], list[Span]] = {}
        others: list[Span] = []
        for span in result.spans:
            if span.iteration not in keep:
                continue
            if span.micro_batch is None:
                others.append(span)
            else:
                passes.setdefault((span.micro_batch, span.rank), []).append(span)
        for (mb_id, rank), spans in passes.items():
            events.extend(_pass_events(pid, rank, result.micro_batches[mb_id], spans))
        for span in others:
            if span.duration_s <= 0:
                continue
            if span.kind == SYNC:
                args = {"iteration": span.iteration, "world_size": result.world_size}
                events.append(
                    _slice(
                        "grad all-reduce",
                        "collective",
                        pid,
                        span.rank,
                        span.start_s,
                        span.duration_s,
                        args,
                    )
                )
            elif span.kind == IDLE:
                events.append(_slice("idle", "idle", pid, span.rank, span.start_s, span.duration_s))
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


def _pass_events(
    pid: int, rank: int, run: MicroBatchRun, spans: list[Span]
) -> list[dict[str, Any]]:
    start = min(s.start_s for s in spans)
    end = max(s.end_s for s in spans)
    args = {
        "iteration": run.iteration,
        "group": f"ranks {run.rank_start}..{run.rank_start + run.sp_size - 1}",
        "sp_size": run.sp_size,
        "micro_batch": run.id,
        "samples": run.samples,
        "tokens": run.tokens,
        "memory_GiB": round(run.memory_bytes / 2**30, 3),
    }
    name = f"{run.bucket} x{run.samples} (sp {run.sp_size})"
    out = [_slice(name, "micro_batch", pid, rank, start, end - start, args)]
    for span in spans:
        if span.kind in _NESTED and span.duration_s > 0:
            label, category = _NESTED[span.kind]
            out.append(_slice(label, category, pid, rank, span.start_s, span.duration_s))
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
        **_ts_dur(start_s, start_s + duration_s),
    }
    if args:
        event["args"] = args
    return event


def _ts_dur(start_s: float, end_s: float) -> dict[str, float]:
    """``ts`` and ``dur`` in microseconds from integer-nanosecond start and end."""
    start_ns, end_ns = round(start_s * _NS), round(end_s * _NS)
    return {"ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000}


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event
