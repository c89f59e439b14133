"""How much of the gradient reduction each ``shard`` setting hides behind backward.

Two gloo ranks on the CPU run the same iteration (each rank an SP group of one with
two micro-batches of the ``llama`` preset) under ``none``, ``ddp`` and ``fsdp2``.
``none`` reduces after backward, so its step is compute plus the whole reduction
``R`` (the runtime's sync span). Under ``ddp`` and ``fsdp2`` the reduction runs inside
the last backward; what it still adds is ``exposed = step - compute(none)``, and the
exposed share is ``exposed / R``. Medians over the repeats; writes a dated markdown
table next to this script (``grad_overlap.md``). On a busy CPU the step-to-step noise
can exceed the reduction itself: read the table's spread before using a share.

    PYTHONPATH=. python benchmarks/grad_overlap.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path

import torch

from datacentric.models.presets import build_model
from datacentric.parallel.grad_sync import wrap_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.loss import loss_tokens_function
from datacentric.parallel.runtime import DataCentricRuntime
from datacentric.parallel.step import run_step
from datacentric.planning.sharding import ShardingSpec
from datacentric.verify.case_models import build_case
from datacentric.verify.equivalence import mixed_iteration


def _worker(mode: str, repeats: int) -> dict[str, float]:
    groups = ProcessGroups()
    dataset = build_case("llama", 0, torch.float32)[1]
    torch.manual_seed(0)
    module = build_model("llama")
    model = wrap_model(module, groups, ShardingSpec(mode))
    runtime = DataCentricRuntime(model, groups, dataset.pack, loss_tokens_function(dataset))
    iteration = mixed_iteration(dataset.shapes(), 2, len(module.blocks), sizes=[1, 1])
    steps, syncs, computes = [], [], []
    for k in range(repeats + 1):
        for p in model.parameters():
            p.grad = None
        stats = run_step(runtime, iteration).stats
        if k:  # the first step warms up (FSDP2's lazy init, allocations)
            steps.append(stats.total_time_s)
            syncs.append(stats.sync_time_s)
            computes.append(sum(mb.time_s for mb in stats.micro_batches))
    return {
        "step_s": statistics.median(steps),
        "sync_s": statistics.median(syncs),
        "compute_s": statistics.median(computes),
        "params": sum(p.numel() for p in module.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args()
    rows = {}
    for mode in ("none", "ddp", "fsdp2"):
        ranks = spawn(_worker, 2, mode, args.repeats, timeout_s=900)
        rows[mode] = {k: max(r[k] for r in ranks) for k in ranks[0]}  # the slower rank
    base = rows["none"]
    reduction = base["sync_s"]
    lines = [
        f"# Gradient reduction overlap ({datetime.date.today().isoformat()})",
        "",
        f"`python benchmarks/grad_overlap.py --repeats {args.repeats}`: 2 gloo ranks, CPU, "
        f"`llama` preset ({base['params']:,} parameters, fp32), two micro-batches per rank, "
        "medians of the slower rank. Exposed = step - compute(none); share = exposed / "
        "the reduction measured under `none`. Timings on a shared CPU: approximate.",
        "",
        "| shard | step ms | compute ms | reduction after backward ms | exposed ms | "
        "exposed share |",
        "|---|---|---|---|---|---|",
    ]
    for mode, row in rows.items():
        exposed = row["step_s"] - base["compute_s"]
        share = max(0.0, exposed) / reduction if reduction > 0 else float("nan")
        lines.append(
            f"| {mode} | {row['step_s'] * 1e3:.1f} | {row['compute_s'] * 1e3:.1f} | "
            f"{row['sync_s'] * 1e3:.1f} | {exposed * 1e3:.1f} | {share:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
