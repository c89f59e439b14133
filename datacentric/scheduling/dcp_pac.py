"""``dcp-pac``: ``dcp-inter`` with Pyramid Activation Checkpointing.

PAC changes only how much a bucket recomputes, never where it runs: each bucket keeps
``dcp-inter``'s SP size (its cheapest under one recomputation setting for all data),
and at that size runs whichever of no recomputation, every block, or the plan's
knapsack choice costs the fewest GPU-seconds per sample, at its largest micro-batch.
Short sequences have memory to spare there, so they recompute fewer blocks. Placement
is ``dcp-inter``'s.

Letting PAC also move a bucket to another SP size (say SP 8 without recomputation
instead of SP 1 with it) is what ``dcp-opt`` does; under ``dcp-inter``'s placement,
which opens a group for every SP size a step's buckets prefer, it left the few
groups of the larger sizes nearly empty (38% idle on ``opensora-short`` at 32 GPUs).
"""

from __future__ import annotations

from datacentric.scheduling.dcp_intra import fixed_size_schedule
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-pac`` policy."""
    inter, pac = inp.uniform_table(), inp.pac_table()
    configs = {}
    for b in inp.active_buckets():
        cfg = pac.config(b, inter.preferred(b).sp_size)
        configs[b] = (cfg, float(cfg.max_batch))
    return fixed_size_schedule(inp, pac, configs)
