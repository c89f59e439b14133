"""``static-reference``: the reference implementation's baseline (Open-Sora bucket
parallel as the DCP paper runs it).

- Fixed SP size 4 (capped by ``--max-sp-size``, the world and the SP sizes the model
  runs, e.g. that divide its heads; larger only if some bucket fits nothing at that
  size, as every policy exceeds ``--max-sp-size`` only there), every block recomputing.
- Each bucket's micro-batch is found by doubling from one sample until the next
  doubling runs out of memory (the largest power of two that fits).
- Buckets whose micro-batch is slower than the median bucket's are shrunk to the
  median time.
- Each step's micro-batches (in the data order) are dealt round-robin to the
  data-parallel groups.
"""

from __future__ import annotations

import numpy as np

from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import emit_iteration, pack
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.placement import assign_to_layout
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput

#: The reference's SP size.
REFERENCE_SP = 4


def reference_sp(inp: PolicyInput, table: OptionTable) -> int:
    """SP 4 (at most ``--max-sp-size``), or the largest runnable size below it; larger only
    if a bucket needs it."""
    buckets = inp.active_buckets()
    ok = [s for s in table.all_sizes if all(table.config(b, s) is not None for b in buckets)]
    if not ok:
        table.min_sp(max(buckets, key=lambda b: inp.view.rep_tokens(b)))
        raise ValueError(
            f"static-reference: no single SP size up to {inp.world_size} fits every bucket"
        )
    below = [s for s in ok if s <= min(REFERENCE_SP, inp.options.max_sp_size or REFERENCE_SP)]
    return below[-1] if below else ok[0]


def doubling_batches(inp: PolicyInput, table: OptionTable, sp: int) -> dict[int, int]:
    """Per bucket: the largest power of two that fits, shrunk to the median time."""
    batch = {}
    for b in inp.active_buckets():
        limit = table.config(b, sp).max_batch
        batch[b] = 1 << (max(1, int(limit)).bit_length() - 1)
    full = {b: table.config(b, sp).time(batch[b]) for b in batch}
    target = float(np.median(list(full.values())))
    return {
        b: min(batch[b], table.config(b, sp).batch_for_time(target))
        if full[b] > target
        else batch[b]
        for b in batch
    }


def batch_names(inp: PolicyInput, batch: dict[int, int]) -> dict[str, int]:
    """``batch`` keyed by bucket name (for ``settings``)."""
    return {inp.view.buckets[b].name: int(n) for b, n in batch.items()}


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``static-reference`` policy."""
    table = inp.full_table()
    sp = reference_sp(inp, table)
    batch = doubling_batches(inp, table, sp)
    n_groups = max(1, inp.world_size // sp)
    chunks, dropped = inp.global_batches()
    settings = {"sp_size": sp, "recompute": "full", "micro_batch_samples": batch_names(inp, batch)}
    out = PolicyOutput(iterations=[], dropped=dropped, settings=settings)
    view = inp.view
    for k, chunk in enumerate(chunks):
        buckets = view.bucket_of[chunk]
        items: list[Item] = []
        for b in np.unique(buckets).tolist():
            items += pack(table, b, chunk[buckets == b], batch[b], sort=False)
        items = [items[i] for i in inp.rng.permutation(len(items))]
        if len(items) >= n_groups:
            groups = [(sp, items[g::n_groups]) for g in range(n_groups)]
        else:  # a step too small to give every group a micro-batch
            groups = assign_to_layout(items, [sp] * n_groups, table, inp.world_size)
        out.iterations.append(emit_iteration(k, inp.world_size, groups, table))
    return out
