"""``packed``: fixed SP size, short sequences packed up to a token budget.

The SP size and recomputation are ``static``'s. Samples, shuffled, are packed in
order (next-fit, no padding: variable-length attention) into micro-batches of at
most the token budget: the tokens of the longest bucket's largest micro-batch. A
packed micro-batch whose memory the cost model puts over the cap (possible when it
mixes shapes) is halved until it fits. Each iteration every group takes the next
``accumulation`` micro-batches.
"""

from __future__ import annotations

from datacentric.scheduling.item import Item
from datacentric.scheduling.micro_batches import make_item
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput
from datacentric.scheduling.static import fixed_groups, uniform_sp


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
            items += fitting_items(inp, table, current, sp)
            current, used = [], 0
        current.append(i)
        used += t
    if current:
        items += fitting_items(inp, table, current, sp)
    return items


def fitting_items(inp: PolicyInput, table: OptionTable, ids: list[int], sp: int) -> list[Item]:
    """``ids`` as one item, halved recursively while the cost model says it does not
    fit (a single sample always stays: its bucket fits on ``sp``)."""
    item = make_item(table, ids)
    if len(ids) == 1:
        return [item]
    if table.fits(ids, sp, table.config(item.bucket, sp).recompute):
        return [item]
    half = len(ids) // 2
    return fitting_items(inp, table, ids[:half], sp) + fitting_items(inp, table, ids[half:], sp)


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``packed`` policy."""
    table = inp.uniform_table()
    sp = uniform_sp(inp, table)
    order = inp.rng.permutation(inp.active).tolist()
    items = pack_in_order(inp, table, order, token_budget(inp, table, sp), sp)
    return fixed_groups(inp, table, sp, items, inp.options.accumulation)
