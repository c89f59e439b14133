"""The ``[scheduling]`` section: the policy and the options every policy reads (torch-free).

:class:`SchedulingConfig` is the one type of the section: the settings hold it
(``settings.scheduling``), and the pipeline and every policy take it as it is
(:class:`~datacentric.scheduling.pipeline.Pipeline`'s ``options``).
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from dataclasses import dataclass
from typing import Literal

Policy = Literal[
    "static",
    "static-reference",
    "packed",
    "dcp-intra",
    "dcp-inter",
    "dcp-pac",
    "megatron-dyncp",
    "dcp-opt",
]
#: Every scheduling policy's name, in the order the help lists them (the one list:
#: :data:`datacentric.scheduling.POLICIES` holds one function for each).
POLICY_NAMES: tuple[str, ...] = typing.get_args(Policy)

#: The largest micro-batch (in samples) the planner searches a bucket's options up to:
#: the default of ``max_micro_batch_size``, written once.
MAX_MICRO_BATCH_SIZE = 4096

#: Older names of one setting -> its name now: either may be given, and the section
#: holds the value under both (``tokens_per_iteration`` is ``global_batch_tokens``).
OLDER_NAMES = {
    "tokens_per_iteration": "global_batch_tokens",
    "samples_per_iteration": "global_batch_samples",
}


def with_older_names(current: dict, changes: dict) -> dict:
    """``current`` field values with ``changes`` set, each older name
    (:data:`OLDER_NAMES`) set together with its new one."""
    values = {**current, **changes}
    for old, new in OLDER_NAMES.items():
        for key, partner in ((old, new), (new, old)):
            if key in changes and partner not in changes:
                values[partner] = changes[key]
    return values


@dataclass(kw_only=True)
class SchedulingConfig:
    """The ``[scheduling]`` section: the policy and the knobs of
    :func:`datacentric.scheduling.build_schedule`.

    Defaults give every policy the same SP sizes and the same global-batch bound, so
    that policies are compared on equal terms; the memory cap and each bucket's
    options come from the plan. A bad value raises ``ValueError`` naming it.
    """

    policy: Policy = "dcp-opt"
    """Scheduling policy (docs/scheduling.md)."""
    max_sp_size: int | None = None
    """Largest SP size tried; default: a node (``gpus_per_node``), larger only for
    buckets that fit nothing within a node."""
    global_batch_tokens: int | None = None
    """The global batch in tokens: every policy runs exactly one iteration (optimizer
    step) per global batch, and the data order chooses each step's samples (see
    :mod:`~datacentric.scheduling.global_batches`); default ``world * max(2**18,
    longest sample)``, but ``datacentric train`` (and ``schedule`` and ``simulate``, to
    count its steps) sizes it from a small dataset (fewer tokens than 8 such batches of
    one rank) so an epoch has 8 steps, and records it in the run's ``config.toml``.
    Ignored when ``global_batch_samples`` is set."""
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
    max_micro_batch_size: int = MAX_MICRO_BATCH_SIZE
    """Largest micro-batch in samples: the planner searches each bucket's options up to
    it (a saved plan's options carry the bound they were made under,
    ``Plan.option_batch_limit``)."""
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
        self._check_older_names()
        for old, new in OLDER_NAMES.items():
            a, b = getattr(self, new), getattr(self, old)
            setattr(self, new, a if a is not None else b)
            setattr(self, old, a if a is not None else b)
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming a value no policy can run with."""
        if self.policy not in POLICY_NAMES:
            raise ValueError(
                f"unknown policy {self.policy!r}; choose one of {', '.join(POLICY_NAMES)}"
            )
        self._check_older_names()
        if self.reorder_window < 1:
            raise ValueError(f"scheduling.reorder_window must be >= 1, got {self.reorder_window}")
        for name in ("global_batch_tokens", "global_batch_samples", "max_sp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"scheduling.{name} must be >= 1, got {value}")
        if self.max_micro_batch_size < 1:
            raise ValueError("scheduling.max_micro_batch_size must be >= 1")

    def _check_older_names(self) -> None:
        """``ValueError`` naming a setting given two values, under its name and its older
        name (the message starts with ``scheduling.NAME:``, so a settings file that gave
        them is named with it)."""
        for old, new in OLDER_NAMES.items():
            a, b = getattr(self, new), getattr(self, old)
            if a is not None and b is not None and a != b:
                raise ValueError(
                    f"scheduling.{new}: {a}, and {b} under its older name {old}: give one "
                    "of them, not both"
                )

    def updated(self, **values: object) -> SchedulingConfig:
        """A copy with ``values`` set (an older name and its new one set together)."""
        return SchedulingConfig(**with_older_names(dataclasses.asdict(self), values))


def deprecated_schedule_options(where: str) -> type[SchedulingConfig]:
    """``ScheduleOptions``, read from ``where``: the older name of
    :class:`SchedulingConfig` (the ``[scheduling]`` section), with a warning."""
    warnings.warn(
        f"{where}.ScheduleOptions is deprecated and will be removed in 0.3.0: it is the "
        "[scheduling] section, datacentric.settings.SchedulingConfig (which also holds "
        "the policy)",
        DeprecationWarning,
        stacklevel=3,
    )
    return SchedulingConfig
