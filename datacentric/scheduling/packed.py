"""``packed``: fixed SP size, short sequences packed up to a token budget.

The SP size and recomputation are the smallest that fit every bucket. Each step's
samples (in the data order) are packed in order (next-fit, no padding:
variable-length attention) into micro-batches of at most the token budget: the
tokens of the longest bucket's largest micro-batch. A packed micro-batch whose
memory the cost model puts over the cap (possible when it mixes shapes) is halved
until it fits. Micro-batches are dealt longest first to the equal groups.
"""

from __future__ import annotations

from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import emit_iteration, make_item
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput
from datacentric.scheduling.static import equal_groups, uniform_sp


def token_budget(inp: PolicyInput, table: OptionTable, sp: int) -> int:
    """Tokens of the largest micro-batch of the longest active bucket on ``sp`` ranks."""
    top = max(inp.active_buckets(), key=lambda b: inp.view.rep_tokens(b))
    return table.config(top, sp).max_batch * inp.view.rep_tokens(top)


def pack_in_order(
    inp: PolicyInput, table: OptionTable, order: list[int], budget: int, sp: int
) -> list[Item]:
    """Next-fit packing of ``order`` into items of at most ``budget`` tokens that fit
    in memory on ``sp`` ranks."""
    tokens = inp.view.tokens
    items: list[Item] = []
    current: list[int] = []
    used = 0
    for i in order:
        t = int(tokens[i])
        if current and used + t > budget:
            items += fitting_items(table, current, sp)
            current, used = [], 0
        current.append(i)
        used += t
    if current:
        items += fitting_items(table, current, sp)
    return items


def fitting_items(table: OptionTable, ids: list[int], sp: int) -> list[Item]:
    """``ids`` as one item, halved recursively while the cost model says it does not
    fit (a single sample always stays)."""
    item = make_item(table, ids)
    if len(ids) == 1:
        return [item]
    cfg = table.config(item.bucket, sp)
    if cfg is not None and table.fits(ids, sp, cfg.recompute, cfg.ring_size):
        return [item]
    half = len(ids) // 2
    return fitting_items(table, ids[:half], sp) + fitting_items(table, ids[half:], sp)


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``packed`` policy."""
    table = inp.uniform_table()
    sp = uniform_sp(inp, table)
    budget = token_budget(inp, table, sp)
    chunks, dropped = inp.global_batches()
    out = PolicyOutput(iterations=[], dropped=dropped)
    for k, chunk in enumerate(chunks):
        items = pack_in_order(inp, table, chunk.tolist(), budget, sp)
        out.iterations.append(
            emit_iteration(k, inp.world_size, equal_groups(inp, table, sp, items), table)
        )
    return out
