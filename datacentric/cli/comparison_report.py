"""A measured comparison of policies, as ``bench`` and ``demo`` run and report it: the
settings of the CPU comparison (:data:`BENCH_DEFAULTS`) and the summary of its runs
(median throughput per policy, the best DCP policy's speedup with its range over the
repeats, the simulator's error, whether the loss curves agree). No command owns this
module.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from datacentric.settings.command_defaults import command_settings
from datacentric.settings.layout import flat_defaults

if TYPE_CHECKING:
    from datacentric.train.comparison.measured_comparison import Comparison

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
    from datacentric.train.comparison.measured_comparison import speedup_range

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
