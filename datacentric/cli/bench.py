"""``datacentric bench``: measured throughput of ``static`` and the DCP policies on the
same samples and steps, in one run, with the simulator's prediction beside it."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from datacentric.cli.flags import add_policy_flag, add_world_flag, config_option, enable_config_file
from datacentric.cli.plan import DATASET_HELP, add_data_arguments
from datacentric.cli.train import check_dataset
from datacentric.settings import load_config

if TYPE_CHECKING:
    from datacentric.train.measured_comparison import PolicyMeasurement

#: Settings of the CPU comparison: the tiny Llama on the standard-library corpus with
#: a memory cap under which the longest files need SP 2 or recomputation. The model is
#: held whole on each rank (``shard`` none, one gradient all-reduce after the step's
#: passes): under FSDP2 on gloo, the last backward's per-block reduce-scatters tie the
#: ranks together mid-pass, and on two CPU cores that slowed the other rank's remaining
#: micro-batches (1.5 s -> 3.6 s), which the simulator does not model (errors 6.5-15.1%
#: with FSDP2, 0.6-1.5% without, same command, 2026-12-01).
BENCH_DEFAULTS: dict[str, Any] = {
    "model": "llama",
    "dataset": "stdlib",
    "dataset_limit": 12,
    "max_tokens": 4096,
    "memory_gb": 0.2,
    "tokens_per_iteration": 16384,
    "lr": 3e-3,
    "progress": False,
    "shard": "none",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure static vs DCP policies side by side, with the simulator's view"
    )
    add_world_flag(parser, default=2, help="local gloo ranks")
    add_policy_flag(
        parser, several=True, default="static,dcp-pac,dcp-opt", note="; the first is the baseline"
    )
    config_option(parser, "--out", key="out", default="runs/bench", help="run folder")
    config_option(parser, "--model", key="model", help="runnable model preset (default: llama)")
    config_option(parser, "--dataset", key="dataset", help=DATASET_HELP + " (default: stdlib)")
    add_data_arguments(parser, BENCH_DEFAULTS["max_tokens"])
    config_option(
        parser, "--memory-gb", key="memory_gb", type=float, help="per-rank memory cap in GiB"
    )
    config_option(
        parser,
        "--shard",
        key="shard",
        choices=("none", "ddp", "fsdp2"),
        help="how model state is held across ranks (default: none, see BENCH_DEFAULTS)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    enable_config_file(parser)
    parser.set_defaults(func=run)


#: The reference baseline (fixed SP, per-bucket batch), reported beside tuned ``static``.
REFERENCE = "static-reference"

#: Per-step losses of two policies agree when within this relative difference.
LOSS_RTOL = 1e-5


def losses_equal(curves: list[list[float]], rtol: float = LOSS_RTOL) -> bool:
    """Whether every loss curve has the same steps and per-step losses within ``rtol``
    (relative) of the first curve's: the same global batches make this hold."""
    first = curves[0]
    return all(
        len(c) == len(first)
        and all(abs(a - b) <= rtol * max(abs(b), 1e-12) for a, b in zip(c, first))
        for c in curves[1:]
    )


def bench_summary(results: dict[str, PolicyMeasurement], baseline: str) -> dict[str, Any]:
    """The JSON summary: throughput per policy, the best DCP policy's speedup over
    ``baseline`` (and over ``static-reference`` when it ran; all at the same global
    batch), simulator agreement and whether the loss curves agree."""
    base = results[baseline]
    others = {p: r for p, r in results.items() if p != baseline and p.startswith("dcp")}
    best = max(others, key=lambda p: others[p].tokens_per_s) if others else baseline
    return {
        "losses_equal": losses_equal([r.losses for r in results.values()]),
        "baseline": baseline,
        "policies": {p: r.tokens_per_s for p, r in results.items()},
        "best_policy": best,
        "speedup": results[best].tokens_per_s / base.tokens_per_s,
        "sim_predicted_speedup": (
            results[best].predicted_tokens_per_s / base.predicted_tokens_per_s
        ),
        **(
            {
                "speedup_vs_static_reference": results[best].tokens_per_s
                / results[REFERENCE].tokens_per_s
            }
            if REFERENCE in results
            else {}
        ),
        "sim_rel_err": max(r.sim_rel_err for r in results.values()),
        "details": {
            p: {
                "tokens": r.tokens,
                "steps": r.steps,
                "tokens_per_step_mean": r.tokens_per_step,
                "measured_s": r.measured_s,
                "runtime_s": r.runtime_s,
                "predicted_s": r.predicted_s,
                "sim_rel_err": r.sim_rel_err,
                "first_loss": r.losses[0],
                "final_loss": r.losses[-1],
                "measured_idle_share": r.measured_idle_share,
                "est_idle_share": r.est_idle_share,
            }
            for p, r in results.items()
        },
    }


def run(args: argparse.Namespace) -> int:
    from datacentric.train.measured_comparison import compare_policies

    overrides = dict(BENCH_DEFAULTS)
    keys = ("model", "dataset", "dataset_limit", "memory_gb", "max_tokens", "tokenizer")
    for key in (*keys, "text_field", "shard", "long_docs", "bucket_config"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    config = load_config(None, out=args.out, **overrides)
    if not check_dataset(config, "bench"):
        return 2
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    results = compare_policies(config, policies, args.world, args.out)
    summary = bench_summary(results, policies[0])
    summary["world"] = args.world
    if args.json:
        print(json.dumps(summary))
    else:
        print(json.dumps(summary, indent=2))
    return 0
