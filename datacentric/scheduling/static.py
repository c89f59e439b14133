"""``static``: the baseline users run today (Open-Sora bucket parallel).

One SP size for all data, the smallest that fits one sample of the longest bucket;
one recomputation setting (none if every bucket fits without, else every block).
Each bucket's micro-batch is the largest that fits, then shrunk towards the median
bucket time (as the reference's bucket config does) so groups that draw different
buckets finish at similar times. Micro-batches are shuffled; each iteration every
group takes the next ``accumulation`` of them.
"""

from __future__ import annotations

import numpy as np

from datacentric.schedule import group_sizes
from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import assign_to_layout
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def uniform_sp(inp: PolicyInput, table: OptionTable) -> int:
    """The smallest SP size dividing the world on which every active bucket fits."""
    buckets = inp.active_buckets()
    for s in group_sizes(inp.world_size):
        if all(table.config(b, s) is not None for b in buckets):
            return s
    table.preferred(max(buckets, key=lambda b: inp.view.rep_tokens(b)))  # names the bucket
    raise ValueError(f"no single SP size up to {inp.world_size} fits every bucket")


def median_batches(inp: PolicyInput, table: OptionTable, sp: int) -> dict[int, int]:
    """Per bucket, the largest micro-batch whose time is within the median of the
    buckets' full micro-batch times (at least one sample)."""
    buckets = inp.active_buckets()
    full = [table.config(b, sp).times[-1] for b in buckets]
    target = float(np.median(full))
    return {b: table.config(b, sp).batch_for_time(target) for b in buckets}


def bucket_micro_batches(inp: PolicyInput, table: OptionTable, batch: dict[int, int]) -> list[Item]:
    """Every bucket's samples, shuffled, cut into micro-batches; then all shuffled."""
    items: list[Item] = []
    for b in inp.active_buckets():
        items += pack(table, b, inp.rng.permutation(inp.bucket_ids(b)), batch[b], sort=False)
    return [items[i] for i in inp.rng.permutation(len(items))]


def fixed_groups(
    inp: PolicyInput, table: OptionTable, sp: int, items: list[Item], accumulation: int
) -> PolicyOutput:
    """Iterations of ``world / sp`` equal groups taking ``accumulation`` consecutive
    items each; the last, partial iteration is dropped on request or else spread
    over as many groups as it can feed."""
    world = inp.world_size
    n_groups = world // sp
    per_iteration = n_groups * accumulation
    out = PolicyOutput(iterations=[])
    for start in range(0, len(items), per_iteration):
        chunk = items[start : start + per_iteration]
        index = len(out.iterations)
        if len(chunk) == per_iteration:
            groups = [(sp, chunk[g::n_groups]) for g in range(n_groups)]
        elif inp.options.drop_remainder and out.iterations:
            out.dropped = [i for item in chunk for i in item.ids]
            break
        else:
            groups = assign_to_layout(chunk, [sp] * n_groups, table, world)
        out.iterations.append(emit_iteration(index, world, groups, table))
    return out


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``static`` policy."""
    table = inp.uniform_table()
    sp = uniform_sp(inp, table)
    items = bucket_micro_batches(inp, table, median_batches(inp, table, sp))
    return fixed_groups(inp, table, sp, items, inp.options.accumulation)
