"""``dcp-intra``: the paper's first variant: each bucket's own SP size and micro-batch
size, chosen so that groups finish together.

Every bucket runs at its cheapest SP size (one recomputation setting for all data,
as ``packed``); its micro-batch is shrunk towards the median bucket time, and a
bucket whose single sample is slower than that median moves to a larger SP size
within the node until it is not. Each step (one global batch of the shared data
order) gets groups of those sizes in proportion to their GPU-seconds; micro-batches
go longest first to the group of their size that finishes earliest.
"""

from __future__ import annotations

import numpy as np

from datacentric.planning.bucket_options import BucketOption
from datacentric.schedule import Iteration
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import place_at_sizes
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def balanced_configs(inp: PolicyInput, table: OptionTable) -> dict[int, tuple[BucketOption, float]]:
    """Per bucket: its config and micro-batch size, balanced towards the median time."""
    buckets = inp.active_buckets()
    prefs = {b: table.preferred(b) for b in buckets}
    target = float(np.median([c.times[-1] for c in prefs.values()]))
    out = {}
    for b, cfg in prefs.items():
        for s in table.node_sizes:
            alt = table.config(b, s)
            if s > cfg.sp_size and alt is not None and cfg.times[0] > target:
                cfg = alt
        out[b] = (cfg, float(cfg.batch_for_time(target)))
    return out


def fixed_size_schedule(
    inp: PolicyInput, table: OptionTable, configs: dict[int, tuple[BucketOption, float]]
) -> PolicyOutput:
    """One iteration per global batch: each bucket's samples in micro-batches of its
    configured size, placed on groups of its configured SP size."""
    chunks, dropped = inp.global_batches()
    iterations = [fixed_size_step(inp, table, configs, k, c) for k, c in enumerate(chunks)]
    return PolicyOutput(iterations=iterations, dropped=dropped)


def fixed_size_step(
    inp: PolicyInput,
    table: OptionTable,
    configs: dict[int, tuple[BucketOption, float]],
    k: int,
    chunk: np.ndarray,
) -> Iteration:
    """Step ``k`` of :func:`fixed_size_schedule`, of the global batch ``chunk``."""
    buckets = inp.view.bucket_of[chunk]
    items, own = [], []
    for b in np.unique(buckets).tolist():
        cfg, units = configs[b]
        made = pack(table, b, chunk[buckets == b], units)
        items += made
        own += [cfg.sp_size] * len(made)
    groups = place_at_sizes(items, own, table, inp.world_size, inp.options.local_search_moves)
    return emit_iteration(k, inp.world_size, groups, table)


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-intra`` policy."""
    table = inp.uniform_table()
    return fixed_size_schedule(inp, table, balanced_configs(inp, table))
