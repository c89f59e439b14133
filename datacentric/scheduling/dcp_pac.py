"""``dcp-pac``: ``dcp-inter`` with Pyramid Activation Checkpointing.

PAC changes only how much a bucket recomputes, never where it runs: each bucket keeps
``dcp-inter``'s SP size (its cheapest under one recomputation setting for all data),
and at that size runs whichever of no recomputation, every block, or the plan's
knapsack choice costs the fewest GPU-seconds per sample, at its largest micro-batch.
Short sequences have memory to spare there, so they recompute fewer blocks. Placement
is ``dcp-inter``'s.

PAC's knapsack runs per micro-batch where a micro-batch is a single text sample
shorter than its bucket's representative (or mixes buckets): it recomputes what its
own samples need under the cap, not what the representative needs
(:meth:`~datacentric.planning.planner.choose_recompute` through
:meth:`PolicyInput.micro_batch_pac_table`; on ``stdlib-code`` at 64 GPUs this cut the
epoch's GPU-seconds by 5%).

One exception, a bucket whose single sample would fill too much of a step: where one
representative sample at that size takes longer than :data:`MOVE_SHARE` (text; video:
all) of the average step's ideal makespan (the samples' GPU-seconds per the plan's
options, each bucket's per-sample cost scaled to a member by its tokens, over the world
and the steps), the bucket moves to the smallest larger SP size within the node where it
does not (or the largest). ``dcp-inter`` runs those buckets on a larger size too, but only by
accident: with every block recomputing its micro-batches are few and large, so a
step's groups get merged to cover the world (on the held-out long-tailed text of
``benchmarks/longtail_text.py`` at 64 GPUs, step 0 had 32 micro-batches for 64 ranks,
every bucket on SP 2 although each prefers SP 1). PAC recomputes less, so its
micro-batches are smaller and many (345 in that step), nothing is merged, and without
the exception a 98K-token sample ran alone on one GPU for 26.6 s, twice the step
(efficiency 0.253 against dcp-inter's 0.495). With a whole step as the threshold, groups
of 65K-token samples on SP 2 held two of about 5 s each in a 10 s step, too coarse for
the accumulation counts to balance (``stdlib-code`` 0.846 of the certified bound, the
held-out set 0.831); a third of a step gave 0.859 and 0.904.

Letting PAC also move a bucket to another SP size (say SP 8 without recomputation
instead of SP 1 with it) is what ``dcp-opt`` does; under ``dcp-inter``'s placement,
which opens a group for every SP size a step's buckets prefer, it left the few
groups of the larger sizes nearly empty (38% idle on ``opensora-short`` at 32 GPUs).
"""

from __future__ import annotations

import numpy as np

from datacentric.planning.bucket_options import BucketOption
from datacentric.scheduling.dcp_intra import fixed_size_schedule, fixed_size_step
from datacentric.scheduling.option_table import OptionTable
from datacentric.scheduling.policy_input import PolicyInput, PolicyOutput, StepMaker

#: A bucket moves to a larger SP size within the node while one representative sample
#: at its size takes longer than this share of the average step's ideal makespan: its
#: groups then run at least a few micro-batches each, so their counts can balance.
#: Text buckets only: video buckets move at a whole step (at a third, dcp-pac fell from
#: 0.969 / 0.894 / 0.937 to 0.873 / 0.854 / 0.800 of the bound on ``opensora-short`` /
#: ``-balanced`` / ``-long`` at 32 GPUs).
MOVE_SHARE = 1 / 3


def schedule(inp: PolicyInput) -> PolicyOutput:
    """The ``dcp-pac`` policy."""
    table, configs, moved = choose(inp)
    out = fixed_size_schedule(inp, table, configs)
    out.settings = {"moved_to_outlast_no_step": moved}
    return out


def step_makers(inp: PolicyInput) -> list[StepMaker]:
    """``dcp-pac``'s step of a global batch (its choice is made once for the epoch;
    ``dcp-opt``'s portfolio asks it step by step)."""
    table, configs, _ = choose(inp)
    return [lambda k, chunk: fixed_size_step(inp, table, configs, k, chunk)]


def choose(
    inp: PolicyInput,
) -> tuple[OptionTable, dict[int, tuple[BucketOption, float]], dict[str, int]]:
    """The PAC table, each bucket's (option, micro-batch size) and the buckets moved to
    a larger SP size (by name): a function of the epoch's samples, not of its steps."""
    inter, pac = inp.uniform_table(), inp.micro_batch_pac_table()
    chunks, _ = inp.global_batches()
    # the samples' GPU-seconds from the plan's options (each bucket's per-sample cost on
    # its representative, scaled to a member by its tokens: approximate, never searched
    # here, as a policy only reads the plan)
    view, active = inp.view, inp.active
    rep = np.array([view.rep_tokens(b) for b in range(len(view.buckets))], dtype=float)
    per_sample = np.zeros(len(view.buckets))
    for b in inp.active_buckets():
        per_sample[b] = pac.preferred(b).gpu_seconds_per_sample
    buckets = view.bucket_of[active]
    work = float((per_sample[buckets] * view.tokens[active] / rep[buckets]).sum())
    step_s = work / (inp.world_size * max(1, len(chunks)))
    configs, moved = {}, {}
    for b in inp.active_buckets():
        cfg = pac.config(b, inter.preferred(b).sp_size)
        share = MOVE_SHARE if inp.view.buckets[b].shape.grid is None else 1.0
        for s in pac.node_sizes:
            alt = pac.config(b, s)
            if s > cfg.sp_size and alt is not None and cfg.times[0] > step_s * share:
                cfg = alt
                moved[inp.view.buckets[b].name] = s
        configs[b] = (cfg, float(cfg.max_batch))
    return pac, configs, moved
