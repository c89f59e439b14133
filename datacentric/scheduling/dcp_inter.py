"""``dcp-inter``: the paper's second variant: each bucket keeps its profiled settings
(its cheapest SP size and largest micro-batch) and groups are balanced by their
number of gradient-accumulation micro-steps.

With every policy running one iteration per global batch of the shared data order,
a step's groups have the bucket SP sizes in proportion to their GPU-seconds, and the
micro-batches go longest first to the group of their size that finishes earliest: the
accumulation counts differ per group so that groups finish together (the reference
draws groups at random and balances their counts by a rule; here the count follows
from the step's samples). One recomputation setting for all data.

``dcp-pac`` (:mod:`~datacentric.scheduling.dcp_pac`) keeps these SP sizes and adds
Pyramid Activation Checkpointing: per-bucket recomputation.
"""

from __future__ import annotations

from datacentric.scheduling.dcp_intra import fixed_size_schedule
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-inter`` policy (one recomputation setting for all data)."""
    table = inp.uniform_table()
    configs = {}
    for b in inp.active_buckets():
        cfg = table.preferred(b)
        configs[b] = (cfg, float(cfg.max_batch))
    return fixed_size_schedule(inp, table, configs)
