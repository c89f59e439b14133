"""How good a schedule is: per-iteration idle share and efficiency against the ideal.

The **ideal bound** (one function, reused by the simulator): every sample runs at the
cheapest GPU-seconds any feasible configuration gives it, ``sp * time / samples``
over the plan's options: SP sizes (within a node, past it only for buckets that fit
nothing within), recomputation (none, every block, or the plan's choice for its
bucket) and micro-batch sizes (up to the largest that fits the memory cap); the sum over
samples divided by the world size is the epoch time of a perfectly balanced,
communication-free world. A schedule's **efficiency** is that bound over its
estimated epoch time (iterations' makespans plus the exposed gradient sync).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datacentric.planning.bucket_options import cheapest_option
from datacentric.planning.cost_model import CostModel
from datacentric.planning.plan import Plan
from datacentric.schedule import Iteration, Schedule
from datacentric.scheduling.dataset_view import DatasetView
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import any_recompute
from datacentric.shapes import SampleShape

#: Text buckets with more distinct lengths than this are priced at this many
#: log-spaced anchor lengths, per-sample cost interpolated in log-log between them.
ANCHORS = 4


def ideal_epoch_time(
    shapes: Sequence[SampleShape],
    cost_model: CostModel,
    world_size: int,
    *,
    plan: Plan,
    max_sp_size: int | None = None,
    sample_ids: Sequence[int] | None = None,
) -> float:
    """The ideal epoch time in seconds of ``shapes`` (or the subset ``sample_ids``) on
    ``world_size`` ranks (see the module doc), over ``plan``'s options."""
    view = DatasetView(shapes)
    table = OptionTable(
        view,
        cost_model,
        plan,
        world_size=world_size,
        max_sp_size=max_sp_size,
        allowed=any_recompute,
    )
    ids = np.arange(view.num_samples) if sample_ids is None else np.asarray(sample_ids)
    return ideal_gpu_seconds(table, ids) / world_size


def ideal_gpu_seconds(table: OptionTable, ids: np.ndarray) -> float:
    """Sum over samples ``ids`` of their cheapest GPU-seconds (see module doc)."""
    view = table.view
    total = 0.0
    buckets = view.bucket_of[ids]
    for b in np.unique(buckets).tolist():
        lengths = view.tokens[ids[buckets == b]]
        pref = table.preferred(b)
        if view.uniform[b]:
            total += pref.gpu_seconds_per_sample * len(lengths)
            continue
        distinct = np.unique(lengths)
        if len(distinct) > ANCHORS:
            distinct = np.unique(
                np.rint(np.geomspace(distinct[0], distinct[-1], ANCHORS)).astype(np.int64)
            )
        sizes = list(table.node_sizes) if pref.sp_size in table.node_sizes else [pref.sp_size]
        costs = []
        rcs = table.recomputes(b)
        # The bound prices members shorter than the representative, which the plan's
        # options (planned on the representative) do not cover: on the bucket's own
        # SP sizes and recomputation settings, under the plan's cap.
        # Longest first; each (size, recomputation) starts its search from the last
        # answer scaled to the new length: a few memory queries instead of twenty.
        last: dict[int, dict[tuple[bool, ...], tuple[int, int]]] = {s: {} for s in sizes}
        for length in distinct[::-1].tolist():
            shape = SampleShape.text(int(length))
            options = []
            for s in sizes:
                guess = {rc: max(1, bs * prev // length) for rc, (bs, prev) in last[s].items()}
                cfg = cheapest_option(
                    table.cost_model,
                    shape,
                    s,
                    rcs,
                    table.cap,
                    table.plan.option_batch_limit,
                    guesses=guess,
                    curve=False,
                )
                last[s] = {rc: (bs, length) for rc, bs in guess.items()}
                if cfg is not None:
                    options.append(cfg)
            costs.append(min(c.gpu_seconds_per_sample for c in options))
        costs.reverse()
        log_cost = np.interp(np.log(lengths), np.log(distinct), np.log(costs))
        total += float(np.exp(log_cost).sum())
    return total


def iteration_imbalance(it: Iteration, world_size: int) -> float:
    """Idle share of the iteration's GPU time by the micro-batches' estimates."""
    span = it.est_makespan_s
    if span <= 0:
        return 0.0
    return 1.0 - sum(a.sp_size * a.est_time_s for a in it.assignments) / (world_size * span)


def schedule_measures(
    schedule: Schedule, cost_model: CostModel, ideal_epoch_time_s: float | None
) -> dict[str, float | list[float] | None]:
    """Imbalance per iteration and mean, estimated epoch time and efficiency."""
    world = schedule.world_size
    imbalance = [iteration_imbalance(it, world) for it in schedule.iterations]
    sync = float(cost_model.grad_sync_time_s(world))
    epoch = sum(it.est_makespan_s + sync for it in schedule.iterations)
    tokens = [it.num_tokens for it in schedule.iterations] or [0]
    return {
        "tokens_per_step_mean": float(np.mean(tokens)),
        "tokens_per_step_max": int(max(tokens)),
        "imbalance": imbalance,
        "imbalance_mean": float(np.mean(imbalance)) if imbalance else 0.0,
        "est_epoch_time_s": epoch,
        "ideal_epoch_time_s": ideal_epoch_time_s,
        "efficiency": (ideal_epoch_time_s / epoch) if ideal_epoch_time_s and epoch > 0 else None,
    }
