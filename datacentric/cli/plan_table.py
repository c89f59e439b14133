"""A plan as rows and as a table: what ``plan`` and ``profile`` print (one row per
bucket: its preferred option, sample count and memory per rank). No command owns this
module.
"""

from __future__ import annotations

from typing import Any

from datacentric.planning.hardware import GIB, gib_text
from datacentric.planning.plan import Plan
from datacentric.progress import counted
from datacentric.shapes import Bucketing

TABLE_KEY = """\
Reading the table (one row per bucket: the option the plan prefers for it):
  bucket         the bucket's name (text: t<=L, samples of up to L tokens)
  shape          the bucket's largest shape, the one it is planned on (text: tokens)
  samples        the dataset's samples in the bucket (blank for a saved plan)
  sp, ring       the sequence-parallel group size, and its ring degree (sp / ring ranks
                 split the heads, Ulysses; ring 1: Ulysses only); sp 1: no split
  batch          samples per micro-batch
  recomp         blocks that recompute their activations, of the model's blocks
  time s         estimated pass time (forward and backward) of one such micro-batch
  mem GiB        estimated peak memory per rank, under the memory cap below it
  options        configurations that fit the cap (the scheduler may use any of them)
  samples/GPU-s  samples per GPU-second: what the plan maximises
--json prints the same rows with every field (memory in bytes: est_memory_bytes,
memory_cap_bytes).
"""


def plan_json(
    plan: Plan, bucketing: Bucketing | None = None, cost: Any = None
) -> list[dict[str, Any]]:
    """Bucket rows for JSON output: each bucket's preferred option
    (:meth:`~datacentric.planning.plan.Plan.preferred`), with sample counts when the
    bucketing is known and its memory per rank (``est_memory_bytes``) on ``cost``."""
    counts = {}
    if bucketing is not None:
        counts = {b.name: len(m) for b, m in zip(bucketing.buckets, bucketing.members())}
    rows = []
    for bp in plan.buckets.values():
        row = plan.bucket_row(bp.bucket, cost, with_options=False)
        best = plan.preferred(bp.bucket)
        row["max_batch"] = max(o.max_batch for o in bp.options if o.sp_size == best.sp_size)
        row["options"] = len(bp.options)
        if counts:
            row["samples"] = counts.get(bp.bucket, 0)
        rows.append(row)
    return rows


def format_table(plan: Plan, bucketing: Bucketing | None = None, cost: Any = None) -> str:
    """A fixed-width table of the plan (memory per rank on ``cost``)."""
    rows = plan_json(plan, bucketing, cost)
    header = f"{'bucket':<16}{'shape':>16}{'samples':>9}{'sp':>4}{'ring':>5}{'batch':>7}"
    header += f"{'recomp':>8}{'time s':>11}{'mem GiB':>9}{'options':>9}{'samples/GPU-s':>15}"
    lines = [header]
    for row in rows:
        shape = row["shape"] if isinstance(row["shape"], int) else "x".join(map(str, row["shape"]))
        lines.append(
            f"{row['bucket']:<16}{shape!s:>16}{row.get('samples', ''):>9}{row['sp_size']:>4}"
            f"{row.get('ring', 1):>5}{row['micro_batch_size']:>7}"
            f"{row['num_recomputed']:>5}/{plan.num_blocks:<2}"
            f"{row['est_time_s']:>11.4g}{row.get('est_memory_bytes', float('nan')) / GIB:>9.3f}"
            f"{row['options']:>9}"
            f"{row['samples_per_gpu_second']:>15.4g}"
        )
    lines.append(
        f"memory cap {gib_text(plan.memory_cap_bytes)} GiB per rank, world {plan.world_size}"
    )
    for name, count in plan.skipped.items():
        lines.append(f"skipped bucket {name}: {counted(count, 'sample')} (fits no configuration)")
    return "\n".join(lines)
