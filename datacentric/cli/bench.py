"""``datacentric bench``: measured throughput of ``static`` and the DCP policies on the
same samples and steps, in one run, with the simulator's prediction beside it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datacentric.cli.flag_groups import (
    LORA_KEYS,
    add_dataset_flags,
    add_json_flag,
    add_memory_flags,
    add_model_flags,
    add_out_flag,
    add_policy_flag,
    add_shard_flags,
    add_world_flag,
)
from datacentric.cli.flags import enable_config_file
from datacentric.cli.ranks import say
from datacentric.cli.train import check_dataset
from datacentric.settings import load_config
from datacentric.settings.command_defaults import command_settings
from datacentric.settings.layout import flat_defaults

if TYPE_CHECKING:
    from datacentric.train.measured_comparison import Comparison

#: Settings of the CPU comparison (``bench`` and ``demo``): the tiny Llama on the
#: standard-library corpus, the schema's ``max_tokens`` and ``lr``, and ``bench``'s own
#: defaults, declared with their reasons in
#: :data:`~datacentric.settings.command_defaults.COMMAND_DEFAULTS`.
BENCH_DEFAULTS: dict[str, Any] = {
    **{key: flat_defaults()[key] for key in ("model", "dataset", "max_tokens", "lr")},
    **command_settings(
        "bench", ("dataset_limit", "memory_gb", "tokens_per_iteration", "progress", "shard")
    ),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure static vs DCP policies side by side, with the simulator's view"
    )
    add_world_flag(parser, note="local gloo ranks")
    add_policy_flag(parser, several=True, note="; the first is the baseline")
    add_out_flag(parser)
    add_model_flags(parser, note="a runnable preset")
    add_dataset_flags(parser, lengths=False)
    add_memory_flags(parser, fraction=False)
    add_shard_flags(parser, reshard=False)
    parser.add_argument(
        "--runs-per-policy",
        type=int,
        default=None,
        help="runs of each policy, interleaved (A B A B), for the spread between them (default: 2)",
    )
    add_json_flag(parser)
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


def noise_verdict(
    speedup: float, speedup_min: float, speedup_max: float, noise_rel: float = 0.0
) -> str:
    """``within noise`` when the speedup range includes 1.0, or when the speedup (the
    ratio of medians) is no further from 1.0 than the largest run-to-run spread of one
    policy (``noise_rel``: between 1 / (1 + noise_rel) and 1 + noise_rel; with few runs on
    a machine whose load drifts, the pairings alone can miss 1.0); else ``faster`` or
    ``slower``."""
    if speedup_min <= 1.0 <= speedup_max:
        return "within noise"
    if 1.0 / (1.0 + noise_rel) <= speedup <= 1.0 + noise_rel:
        return "within noise"
    return "faster" if speedup_min > 1.0 else "slower"


def bench_summary(comparison: Comparison, baseline: str) -> dict[str, Any]:
    """The JSON summary: median throughput per policy, the best DCP policy's speedup
    over ``baseline`` as the ratio of medians and as a range over the pairings of
    repeats (and the same over ``static-reference`` when it ran; all at the same global
    batch), the spread between repeats (``noise_rel``), the simulator's error against
    the median, whether the loss curves agree, and the machine's load."""
    from datacentric.train.measured_comparison import speedup_range

    results = comparison.policies
    base = results[baseline]
    others = {p: r for p, r in results.items() if p != baseline and p.startswith("dcp")}
    best = max(others, key=lambda p: others[p].tokens_per_s) if others else baseline
    low, high = speedup_range(results[best], base)
    load = comparison.load
    noise = max(r.noise_rel for r in results.values())
    speedup = results[best].tokens_per_s / base.tokens_per_s
    summary: dict[str, Any] = {
        "losses_equal": losses_equal([r.losses for rs in results.values() for r in rs.runs]),
        "baseline": baseline,
        "policies": {p: r.tokens_per_s for p, r in results.items()},
        "best_policy": best,
        "repeats": min(len(r.runs) for r in results.values()),
        "speedup": speedup,
        "speedup_min": low,
        "speedup_max": high,
        "noise_rel": noise,
        "verdict": noise_verdict(speedup, low, high, noise),
        "sim_predicted_speedup": (
            results[best].predicted_tokens_per_s / base.predicted_tokens_per_s
        ),
        "sim_rel_err": max(r.sim_rel_err for r in results.values()),
        "runtime_noise_rel": max(r.runtime_noise_rel for r in results.values()),
        "load_average": {"before": list(load.before), "after": list(load.after)},
        "cpu_share": load.cpu_share,
        "under_load": load.under_load,
        "load": load.to_json(),
        "profiles": comparison.profiles,
    }
    if REFERENCE in results:
        ref_low, ref_high = speedup_range(results[best], results[REFERENCE])
        summary["speedup_vs_static_reference"] = (
            results[best].tokens_per_s / results[REFERENCE].tokens_per_s
        )
        summary["speedup_vs_static_reference_min"] = ref_low
        summary["speedup_vs_static_reference_max"] = ref_high
    summary["details"] = {
        p: {
            "tokens": r.first.tokens,
            "steps": r.first.steps,
            "tokens_per_step_mean": r.first.tokens_per_step,
            "tokens_per_s": r.tokens_per_s,
            "tokens_per_s_runs": [m.tokens_per_s for m in r.runs],
            "measured_s_runs": [m.measured_s for m in r.runs],
            "runtime_s_runs": [m.runtime_s for m in r.runs],
            "noise_rel": r.noise_rel,
            "runtime_noise_rel": r.runtime_noise_rel,
            "predicted_s": r.predicted_s,
            "sim_rel_err": r.sim_rel_err,
            "first_loss": r.first.losses[0],
            "final_loss": r.first.losses[-1],
            "measured_idle_share": statistics.median(m.measured_idle_share for m in r.runs),
            "est_idle_share": r.first.est_idle_share,
            "folders": [m.out for m in r.runs],
        }
        for p, r in results.items()
    }
    return summary


def describe_speedup(summary: dict[str, Any], baseline: str = "the baseline") -> str:
    """``1.01x tuned static (range 0.95-1.07x over 2 repeats, noise 6.1%): within
    noise``."""
    return (
        f"{summary['speedup']:.2f}x {baseline} (range {summary['speedup_min']:.2f}-"
        f"{summary['speedup_max']:.2f}x over {summary['repeats']} repeats, noise "
        f"{summary['noise_rel']:.1%}): {summary['verdict']}"
    )


def run(args: argparse.Namespace) -> int:
    from datacentric.train.comparison_stop import ComparisonStopped
    from datacentric.train.machine_load import (
        busy_cores_now,
        cores,
        describe_start,
        load_average,
    )
    from datacentric.train.measured_comparison import DEFAULT_REPEATS, compare_policies

    overrides = dict(BENCH_DEFAULTS)
    keys = ("model", "dataset", "dataset_limit", "memory_gb", "max_tokens", "tokenizer")
    for key in (*keys, "text_field", "shard", "long_docs", "loss_on", "bucket_config", *LORA_KEYS):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    repeats = DEFAULT_REPEATS if args.runs_per_policy is None else args.runs_per_policy
    if repeats < 1:
        print(f"datacentric bench: --runs-per-policy {repeats}: give at least 1", file=sys.stderr)
        return 2
    config = load_config(None, out=args.out, **overrides)
    if not check_dataset(config, "bench"):
        return 2
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    # stdout holds the summary alone; the load notes go to stderr
    print(
        f"datacentric bench: {describe_start(load_average(), cores(), busy_cores_now())}",
        file=sys.stderr,
    )
    try:
        comparison = compare_policies(config, policies, args.world, args.out, repeats=repeats)
    except ComparisonStopped as stop:
        say("bench", str(stop))
        return 128 + stop.signum
    summary = bench_summary(comparison, policies[0])
    summary["world"] = args.world
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(
        json.dumps(summary, indent=2) + "\n", encoding="utf-8"
    )
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    print(
        f"datacentric bench: {summary['best_policy']} at "
        f"{describe_speedup(summary, summary['baseline'])}; "
        f"{comparison.load.describe()}",
        file=sys.stderr,
    )
    return 0
