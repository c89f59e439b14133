"""Settings shared by every scheduling policy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ScheduleOptions:
    """Knobs of :func:`datacentric.scheduling.build_schedule`.

    Defaults give every policy the same SP sizes and the same global-batch bound, so
    that policies are compared on equal terms; the memory cap and each bucket's
    options come from the plan.
    """

    max_sp_size: int | None = None
    """Largest SP size tried; default: a node (``gpus_per_node``), larger only for
    buckets that fit nothing within a node."""
    tokens_per_iteration: int | None = None
    """Global-batch bound in tokens for the policies that batch by a bound
    (``packed``, ``megatron-dyncp``, ``dcp-opt``); default ``world * max(2**18,
    longest sample)``. Ignored when ``samples_per_iteration`` is set."""
    samples_per_iteration: int | None = None
    """Global-batch bound in samples (instead of tokens)."""
    accumulation: int = 1
    """Micro-batches per group and iteration for ``static``, ``packed`` and ``dcp-intra``."""
    min_accumulation: int = 1
    """Smallest accumulation count of a group (``dcp-inter``, ``dcp-pac``)."""
    max_accumulation: int = 5
    """Largest accumulation count of a group (``dcp-inter``, ``dcp-pac``; the reference
    benchmark's 5)."""
    drop_remainder: bool = False
    """Leave out the last, partial global batch; the dropped ids are reported in
    ``Schedule.dropped_sample_ids`` and ``meta['samples_dropped']``."""
    max_micro_batch_size: int = 4096
    """Upper bound on samples in one micro-batch when ``build_schedule`` makes the plan
    (a given plan's options carry their own, ``Plan.option_batch_limit``)."""
    megatron_tokens_per_rank: int | None = None
    """``megatron-dyncp``'s per-rank token limit; default: the most tokens one rank
    holds for every bucket (from the memory cap, full recomputation)."""
    exact_estimates: bool | None = None
    """Give every micro-batch the cost model's time for its actual samples (True), or
    interpolate multi-sample micro-batches of text buckets on their bucket's cost
    curve (False: the cost model is then asked only per bucket, single sample and
    mixed micro-batch). Default: exact up to 200,000 scheduled samples."""
    exact_solver: bool = True
    """``dcp-opt``: let HiGHS improve small, badly balanced iterations (see
    ``docs/scheduling.md``); the heuristic alone when False or highspy is missing."""
    exact_max_binaries: int = 600
    """``dcp-opt``: largest assignment MILP (items x groups) handed to HiGHS."""
    exact_max_nodes: int = 200
    """``dcp-opt``: branch-and-bound node limit (deterministic, unlike a time limit)."""
    item_split: float = 4.0
    """``dcp-opt``: a micro-batch takes at most ``1/item_split`` of the target makespan
    (smaller micro-batches balance better; 0 disables the cap)."""
    local_search_moves: int = 2000
    """``dcp-opt``: most improving moves and swaps tried per iteration."""

    def __post_init__(self) -> None:
        for name in ("tokens_per_iteration", "samples_per_iteration", "max_sp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"ScheduleOptions.{name} must be >= 1, got {value}")
        if not 1 <= self.min_accumulation <= self.max_accumulation:
            raise ValueError(
                f"need 1 <= min_accumulation ({self.min_accumulation}) <= max_accumulation "
                f"({self.max_accumulation})"
            )
        if self.accumulation < 1 or self.max_micro_batch_size < 1:
            raise ValueError("accumulation and max_micro_batch_size must be >= 1")
