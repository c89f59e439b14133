"""``dcp-intra``: the paper's first variant: each bucket's own SP size and micro-batch
size, chosen so that groups finish together.

Every bucket runs at its cheapest SP size (one recomputation setting for all data,
as ``static``); its micro-batch is shrunk towards the median bucket time, and a
bucket whose single sample is slower than that median moves to a larger SP size
within the node until it is not. Micro-batches are shuffled; each iteration takes
them in order (looking ahead at most ``4 * world`` for one that fits the ranks
left), one group per micro-batch with ``accumulation`` micro-batches of the same
SP size each. The epoch's last micro-batches, too few for a full iteration, are
placed as ``dcp-opt`` places an iteration.
"""

from __future__ import annotations

import numpy as np

from datacentric.planning.bucket_options import BucketOption
from datacentric.scheduling.dcp_opt import solve_iteration
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def balanced_configs(inp: PolicyInput, table: OptionTable) -> dict[int, tuple[BucketOption, int]]:
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
        out[b] = (cfg, cfg.batch_for_time(target))
    return out


def stream_iterations(
    inp: PolicyInput, table: OptionTable, units: list[tuple[int, list[Item]]]
) -> PolicyOutput:
    """Fill iterations from ``units`` (an SP size and the micro-batches of one group)
    in order; what cannot fill a whole iteration at the end is the remainder."""
    world = inp.world_size
    window = 4 * world
    taken = [False] * len(units)
    first = 0
    out = PolicyOutput(iterations=[])
    while first < len(units):
        left, groups = world, []
        for k in range(first, min(len(units), first + window)):
            if not taken[k] and units[k][0] <= left:
                taken[k] = True
                groups.append(units[k])
                left -= units[k][0]
                if left == 0:
                    break
        while first < len(units) and taken[first]:
            first += 1
        if left:
            rest = [it for _, items in groups for it in items]
            rest += [it for k in range(first, len(units)) if not taken[k] for it in units[k][1]]
            if inp.options.drop_remainder and out.iterations:
                out.dropped = [i for it in rest for i in it.ids]
                break
            groups = solve_iteration(inp, table, rest)
            first = len(units)
        out.iterations.append(emit_iteration(len(out.iterations), world, groups, table))
    return out


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-intra`` policy."""
    table = inp.uniform_table()
    configs = balanced_configs(inp, table)
    items: list[tuple[int, Item]] = []
    for b, (cfg, batch) in configs.items():
        for item in pack(table, b, inp.rng.permutation(inp.bucket_ids(b)), batch, sort=False):
            items.append((cfg.sp_size, item))
    items = [items[i] for i in inp.rng.permutation(len(items))]
    acc = inp.options.accumulation
    units: list[tuple[int, list[Item]]] = []
    open_units: dict[int, list[Item]] = {}
    for sp, item in items:  # group consecutive micro-batches of one SP size by `acc`
        group = open_units.setdefault(sp, [])
        group.append(item)
        if len(group) == acc:
            units.append((sp, group))
            del open_units[sp]
    units += [(sp, group) for sp, group in sorted(open_units.items())]
    return stream_iterations(inp, table, units)
