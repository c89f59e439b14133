"""What every policy works from (:class:`PolicyInput`) and returns (:class:`PolicyOutput`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from datacentric.planning.bucket_options import BucketOption
from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Iteration
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.global_batches import epoch_batches
from datacentric.scheduling.option_table import OptionFilter, OptionTable
from datacentric.settings.scheduling import SchedulingConfig


def no_recompute(option: BucketOption) -> bool:
    """Options that recompute no block."""
    return not any(option.recompute)


def full_recompute(option: BucketOption) -> bool:
    """Options that recompute every block."""
    return all(option.recompute)


def any_recompute(option: BucketOption) -> bool:
    """Every option: none, every block, or the plan's knapsack choice (PAC)."""
    return True


@dataclass
class PolicyInput:
    """Everything a policy needs; built once by ``build_schedule``. ``plan`` is the
    one authority on each bucket's options and on the memory cap."""

    view: DatasetView
    cost_model: CostModel
    world_size: int
    options: SchedulingConfig
    plan: Plan
    rng: np.random.Generator
    active: np.ndarray
    """Sample ids to schedule (ascending)."""
    seed: int = 0
    epoch: int = 0
    tables: dict[str, OptionTable] = field(default_factory=dict)
    on_step: Callable[[int, int], None] | None = None
    """Called with (steps scheduled, steps in the epoch) as a policy finishes steps."""
    _batches: tuple[list[np.ndarray], list[int]] | None = None
    _active_buckets: list[int] | None = None

    def __post_init__(self) -> None:
        self.active_mask = np.zeros(self.view.num_samples, dtype=bool)
        self.active_mask[self.active] = True
        # every micro-batch's estimate is the cost model's own answer unless asked
        # otherwise: a bucket curve prices short members' per-sample costs as the
        # representative's (6x too cheap for 16-token documents of a 256-token bucket)
        self.exact_estimates = self.options.exact_estimates is not False

    @property
    def num_blocks(self) -> int:
        return int(self.cost_model.num_blocks)

    @property
    def memory_cap_bytes(self) -> int:
        """The plan's memory cap per rank."""
        return self.plan.memory_cap_bytes

    def table(
        self,
        name: str,
        allowed: OptionFilter,
        *,
        per_micro_batch: bool = False,
        mixed_knapsack: bool = True,
    ) -> OptionTable:
        """The plan's options that ``allowed`` admits (cached under ``name``);
        ``per_micro_batch`` and ``mixed_knapsack``: see :class:`OptionTable`."""
        if name not in self.tables:
            self.tables[name] = OptionTable(
                self.view,
                self.cost_model,
                self.plan,
                world_size=self.world_size,
                max_sp_size=self.options.max_sp_size,
                allowed=allowed,
                exact_estimates=self.exact_estimates,
                per_micro_batch=per_micro_batch,
                mixed_knapsack=mixed_knapsack,
            )
        return self.tables[name]

    def full_table(self) -> OptionTable:
        """The options with every block recomputing."""
        return self.table("full", full_recompute)

    def uniform_table(self) -> OptionTable:
        """The options of one recomputation setting for all data: none if every active
        bucket has an option without it on some SP size within a node, else every
        block."""
        probe = self.table("none", no_recompute)
        ok = all(
            any(probe.config(b, s) is not None for s in probe.node_sizes)
            for b in self.active_buckets()
        )
        return probe if ok else self.full_table()

    def pac_table(self) -> OptionTable:
        """Per-bucket recomputation: none, every block, or the plan's knapsack choice,
        whichever costs fewest GPU-seconds per sample where it fits."""
        return self.table("pac", any_recompute)

    def micro_batch_pac_table(self) -> OptionTable:
        """:meth:`pac_table` with PAC's knapsack run per micro-batch on its own samples
        where they are shorter than their bucket's representative (``dcp-pac``)."""
        return self.table("pac-micro-batch", any_recompute, per_micro_batch=True)

    def single_sample_pac_table(self) -> OptionTable:
        """:meth:`pac_table` with PAC's knapsack run on each single sample shorter than
        its bucket's representative (``dcp-opt``: a 91K-token document of a bucket
        planned on a 131K one recomputes what it needs, not what the 131K needs)."""
        return self.table(
            "pac-single-sample", any_recompute, per_micro_batch=True, mixed_knapsack=False
        )

    def global_batches(self) -> tuple[list[np.ndarray], list[int]]:
        """The epoch's global batches (one iteration each) and the ids dropped with
        ``drop_remainder``: the data order every policy shares (computed once)."""
        if self._batches is None:
            opts = self.options
            self._batches = epoch_batches(
                self.view,
                self.active,
                seed=self.seed,
                epoch=self.epoch,
                tokens_bound=opts.global_batch_tokens,
                samples_bound=opts.global_batch_samples,
                world_size=self.world_size,
                reorder_window=opts.reorder_window,
                drop_remainder=opts.drop_remainder,
            )
        return self._batches

    def step_done(self, done: int, total: int) -> None:
        """Report ``done`` of the epoch's ``total`` steps scheduled (:attr:`on_step`)."""
        if self.on_step is not None:
            self.on_step(done, total)

    def run_policy(self, name: str, policy: Callable[[PolicyInput], PolicyOutput]) -> PolicyOutput:
        """``policy(self)``, memoised on the plan per cost model for this dataset, world,
        seed, epoch, options and samples (a pure function of them): a comparison of
        policies, or a schedule built again from the same plan, runs each once. Only
        the latest epoch's outputs are kept."""
        out = self.memoised(name)
        if out is None:
            out = self.memoise(name, policy(self))
        return PolicyOutput(list(out.iterations), list(out.dropped), dict(out.settings))

    def memoised(self, name: str) -> PolicyOutput | None:
        """The output of policy ``name`` on this input, when :meth:`memoise` kept one."""
        outputs = self._memo()
        hit = outputs.get(self._memo_key(name))
        return hit[1] if hit is not None and hit[0] is self.view.shapes else None

    def memoise(self, name: str, out: PolicyOutput) -> PolicyOutput:
        """Keep ``out`` as policy ``name``'s output on this input; returns it."""
        self._memo()[self._memo_key(name)] = (self.view.shapes, out)
        return out

    def _memo(self) -> dict:
        memo = self.plan.prices_for(self.cost_model)[0]
        outputs = memo.get("policy-outputs")
        if outputs is None or outputs[0] != (self.seed, self.epoch):
            outputs = memo["policy-outputs"] = ((self.seed, self.epoch), {})
        return outputs[1]

    def _memo_key(self, name: str) -> tuple:
        digest = hashlib.sha1(self.active.tobytes()).hexdigest()
        return (name, self.world_size, repr(self.options), digest, len(self.view.shapes))

    def bucket_ids(self, b: int) -> np.ndarray:
        """Active sample ids of bucket ``b``, ascending."""
        members = self.view.members[b]
        return members[self.active_mask[members]]

    def active_buckets(self) -> list[int]:
        """Buckets with at least one sample to schedule (found once)."""
        if self._active_buckets is None:
            present = np.unique(self.view.bucket_of[self.active])
            self._active_buckets = [int(b) for b in present]
        return list(self._active_buckets)


@dataclass
class PolicyOutput:
    """Iterations of a policy, the samples it dropped on request, and what it chose."""

    iterations: list[Iteration]
    dropped: list[int] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    """JSON-able: the configuration a policy chose for the run (``static``'s SP size,
    recomputation and token budget; ``megatron-dyncp``'s cap and recomputation)."""


#: One step of a policy's epoch: ``make(k, chunk)`` is step ``k`` of the global batch
#: ``chunk`` (``ValueError`` where that configuration cannot run the step).
StepMaker = Callable[[int, np.ndarray], Iteration]


@dataclass
class PolicySteps:
    """A policy's epoch, step by step: :attr:`steps` yields the iterations in order,
    each one built when it is asked for; :attr:`settings` is complete once they are
    all yielded."""

    steps: Iterator[Iteration]
    dropped: list[int] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, out: PolicyOutput) -> PolicySteps:
        """The steps of a whole epoch's ``out``."""
        return cls(iter(out.iterations), list(out.dropped), dict(out.settings))
