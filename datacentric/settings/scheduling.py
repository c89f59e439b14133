"""The ``[scheduling]`` settings shared by every scheduling policy (torch-free)."""

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
    global_batch_tokens: int | None = None
    """The global batch in tokens: every policy runs exactly one iteration (optimizer
    step) per global batch, and the data order chooses each step's samples (see
    :mod:`~datacentric.scheduling.global_batches`); default ``world * max(2**18,
    longest sample)``, but ``datacentric train`` sizes it from a small dataset (fewer
    tokens than 8 such batches of one rank) so an epoch has 8 steps, and records it in
    the run's ``config.toml``. Ignored when ``global_batch_samples`` is set."""
    global_batch_samples: int | None = None
    """The global batch in samples (instead of tokens)."""
    tokens_per_iteration: int | None = None
    """Older name of ``global_batch_tokens`` (either may be given, not both)."""
    samples_per_iteration: int | None = None
    """Older name of ``global_batch_samples``."""
    reorder_window: int = 1
    """Let samples move between the steps of each window of this many consecutive
    global batches (the paper's sampler); 1 (default): the data order is the same for
    every policy and world size."""
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
    mixed micro-batch). Default: exact (until 2026-12-03 only up to 200,000 scheduled
    samples; above, `schedule` and `simulate` disagreed by up to 11%)."""
    exact_solver: bool = True
    """``dcp-opt``: let HiGHS improve small, badly balanced iterations (see
    ``docs/scheduling.md``); the heuristic alone when False or highspy is missing."""
    exact_max_binaries: int = 600
    """``dcp-opt``: largest assignment MILP (items x groups) handed to HiGHS."""
    exact_max_nodes: int = 200
    """``dcp-opt``: branch-and-bound node limit (deterministic, unlike a time limit)."""
    item_split: float = 2.0
    """``dcp-opt``: a micro-batch takes at most ``1/item_split`` of the target makespan
    (smaller micro-batches balance better, but each pays a fixed cost; under the
    calibrated cost model 2 was as good or better than 4 on every workload preset:
    opensora short/balanced/long at 32 x H100, 0.937/0.925/0.937 -> 0.974/0.926/0.957
    of the ideal bound; text presets unchanged; 0 disables the cap)."""
    local_search_moves: int = 2000
    """``dcp-opt``: most improving moves and swaps tried per iteration."""

    def __post_init__(self) -> None:
        for new, old in (
            ("global_batch_tokens", "tokens_per_iteration"),
            ("global_batch_samples", "samples_per_iteration"),
        ):
            a, b = getattr(self, new), getattr(self, old)
            if a is not None and b is not None and a != b:
                raise ValueError(f"give ScheduleOptions.{new} or its older name {old}, not both")
            object.__setattr__(self, new, a if a is not None else b)
            object.__setattr__(self, old, a if a is not None else b)
        if self.reorder_window < 1:
            raise ValueError(
                f"ScheduleOptions.reorder_window must be >= 1, got {self.reorder_window}"
            )
        for name in ("global_batch_tokens", "global_batch_samples", "max_sp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"ScheduleOptions.{name} must be >= 1, got {value}")
        if self.max_micro_batch_size < 1:
            raise ValueError("max_micro_batch_size must be >= 1")
