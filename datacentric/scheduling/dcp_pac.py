"""``dcp-pac``: ``dcp-inter`` with Pyramid Activation Checkpointing.

Short sequences have memory to spare, so their buckets recompute fewer blocks: each
bucket runs the recomputation with the fewest GPU-seconds per sample among none,
all blocks, and the plan's knapsack choice, at its cheapest SP size and largest
micro-batch. Placement is ``dcp-inter``'s.
"""

from __future__ import annotations

from datacentric.scheduling.dcp_inter import schedule_with
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-pac`` policy."""
    return schedule_with(inp, inp.pac_table())
