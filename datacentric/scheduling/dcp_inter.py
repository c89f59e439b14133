"""``dcp-inter``: the paper's second variant: each bucket keeps its profiled settings
(its cheapest SP size and largest micro-batch) and groups are balanced by their
number of gradient-accumulation micro-steps.

Each iteration draws groups at random (a bucket with probability proportional to
its micro-batches left, among those whose SP size fits the ranks left) until the
world is covered. With ``tau`` the slowest drawn group's time times
``min_accumulation``, group ``i`` runs ``gas_i`` micro-batches of its bucket, the
count in ``[min_accumulation, max_accumulation]`` that brings ``gas_i * t_i``
closest to ``tau``, overshoot weighted 1.2 (the reference's rule). Every group's
micro-batches come from one bucket, as in the reference. The epoch's last
micro-batches, too few to cover the world, are placed as ``dcp-opt`` places an
iteration (or dropped on request).

``dcp-pac`` is the same with Pyramid Activation Checkpointing: per-bucket
recomputation (the plan's knapsack choice, none or all, whichever is cheapest).
"""

from __future__ import annotations

import numpy as np

from datacentric.scheduling.dcp_opt import solve_iteration
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput

OVERSHOOT_PENALTY = 1.2


def accumulation_for(t: float, tau: float, lo: int, hi: int) -> int:
    """The count ``g`` in ``[lo, hi]`` minimising ``|g t - tau|``, overshoot x1.2."""

    def miss(g: int) -> float:
        d = g * t - tau
        return d * OVERSHOOT_PENALTY if d > 0 else -d

    return min(range(lo, hi + 1), key=lambda g: (miss(g), g))


def schedule_with(inp: PolicyInput, table: OptionTable) -> PolicyOutput:
    """``dcp-inter`` over ``table``'s recomputation choices."""
    world, opts, rng = inp.world_size, inp.options, inp.rng
    pools: dict[int, list[Item]] = {}
    config = {}
    for b in inp.active_buckets():
        cfg = config[b] = table.preferred(b)
        pools[b] = pack(table, b, rng.permutation(inp.bucket_ids(b)), cfg.max_batch, sort=False)
        pools[b].reverse()  # the next micro-batch is popped from the end
    out = PolicyOutput(iterations=[])
    while any(pools.values()):
        left, drawn = world, []
        reserved = dict.fromkeys(pools, 0)
        while left:
            cands = [b for b in pools if len(pools[b]) > reserved[b] and config[b].sp_size <= left]
            if not cands:
                break
            weights = np.asarray([len(pools[b]) - reserved[b] for b in cands], dtype=float)
            b = cands[int(rng.choice(len(cands), p=weights / weights.sum()))]
            drawn.append(b)
            reserved[b] += 1
            left -= config[b].sp_size
        if left:  # the end of the epoch: not enough micro-batches to cover the world
            rest = [it for items in pools.values() for it in reversed(items)]
            if opts.drop_remainder and out.iterations:
                out.dropped = [i for it in rest for i in it.ids]
                break
            groups = solve_iteration(inp, table, rest)
            pools = {}
        else:
            full = {b: float(config[b].times[-1]) for b in drawn}
            tau = max(full.values()) * opts.min_accumulation
            groups = []
            for k, b in enumerate(drawn):
                gas = accumulation_for(full[b], tau, opts.min_accumulation, opts.max_accumulation)
                later = drawn[k + 1 :].count(b)  # keep one micro-batch for each later group
                take = max(1, min(gas, len(pools[b]) - later))
                groups.append((config[b].sp_size, [pools[b].pop() for _ in range(take)]))
            pools = {b: items for b, items in pools.items() if items}
        out.iterations.append(emit_iteration(len(out.iterations), world, groups, table))
    return out


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-inter`` policy (one recomputation setting for all data)."""
    return schedule_with(inp, inp.uniform_table())
