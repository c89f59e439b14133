"""Figures of simulated schedules (matplotlib, Agg backend: no display needed).

:func:`plot_results` draws, for each policy, a Gantt chart of one representative
iteration drawn from the result's spans on one time axis shared by every panel (ranks
on the y axis; a pass's compute coloured by the micro-batch's log tokens, its
recomputation red and its all-to-all orange; the gradient reduction grey; idle time
light grey; a legend below the figure names them) and, below, a bar chart of throughput with each
policy's speedup over ``static``. :func:`plot_loss_curves` draws loss against tokens
seen for runs' ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from datacentric.sim.engine import IterationResult, SimResult
from datacentric.timing import COMM, PASS_KINDS, RECOMPUTE, SYNC

#: Colours of what a rank does (compute is coloured by tokens instead).
KIND_COLOURS = {RECOMPUTE: "tab:red", COMM: "tab:orange", SYNC: "0.45", "idle": "0.92"}


def representative_iteration(result: SimResult) -> IterationResult:
    """The iteration whose idle share is closest to the epoch's (ties: the earliest).

    The last iteration (often a partial remainder) is avoided when there are others.
    """
    pool = result.iterations[:-1] or result.iterations
    return min(pool, key=lambda it: (abs(it.idle_share - result.idle_share), it.index))


def plot_results(results: Mapping[str, SimResult], path: str, title: str = "") -> None:
    """Save the Gantt charts and the throughput bar chart of ``results`` to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    policies = list(results)
    world = max(r.world_size for r in results.values())
    gantt_height = max(1.6, min(6.0, 0.12 * world + 1.0))
    fig, axes = plt.subplots(
        len(policies) + 1,
        1,
        figsize=(11, gantt_height * len(policies) + 3.2),
        gridspec_kw={"height_ratios": [gantt_height] * len(policies) + [3.0]},
        squeeze=False,
        layout="constrained",
    )
    tokens = [run.tokens for r in results.values() for run in r.micro_batches.values()]
    lo = math.log10(max(1, min(tokens, default=1)))
    hi = math.log10(max(tokens, default=10))
    norm = colors.Normalize(vmin=lo, vmax=max(hi, lo + 1))
    cmap = plt.get_cmap("viridis")
    # One time axis for every panel: the longest representative iteration.
    longest = max(representative_iteration(r).time_s for r in results.values())
    for ax, policy in zip(axes[:-1, 0], policies):
        _gantt(ax, results[policy], policy, norm, cmap)
        ax.set_xlim(0, longest * 1.01)
    bar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes[:-1, 0]))
    bar.set_label("log10 tokens of the micro-batch (compute)")
    from matplotlib.patches import Patch

    legend = [Patch(facecolor=cmap(0.6), label="compute")]
    labels = {RECOMPUTE: "recomputation", COMM: "all-to-all", SYNC: "gradient sync"}
    legend += [Patch(facecolor=KIND_COLOURS[k], label=v) for k, v in labels.items()]
    legend.append(Patch(facecolor=KIND_COLOURS["idle"], edgecolor="0.7", label="idle"))
    # below every panel: inside the first one it hid that policy's ranks
    fig.legend(handles=legend, loc="outside lower center", fontsize=7, ncols=len(legend))
    _throughput(axes[-1, 0], results)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gantt(ax, result: SimResult, policy: str, norm, cmap) -> None:
    it = representative_iteration(result)
    ax.set_facecolor(KIND_COLOURS["idle"])  # what no span covers is idle
    for span in result.spans:
        if span.iteration != it.index or span.duration_s <= 0:
            continue
        bar = [(span.start_s - it.start_s, span.duration_s)]
        if span.kind in PASS_KINDS and span.kind not in KIND_COLOURS:  # compute
            tokens = result.micro_batches[span.micro_batch].tokens
            colour = cmap(norm(math.log10(max(1, tokens))))
        elif span.kind in KIND_COLOURS:
            colour = KIND_COLOURS[span.kind]
        else:
            continue
        ax.broken_barh(bar, (span.rank, 1), facecolors=colour, edgecolors="white", linewidth=0.3)
    ax.set_ylim(result.world_size, 0)
    step = max(1, result.world_size // 16)
    ranks = list(range(0, result.world_size, step))
    ax.set_yticks([r + 0.5 for r in ranks], [str(r) for r in ranks])
    ax.set_ylabel("rank")
    ax.set_title(
        f"{policy}: iteration {it.index} ({it.time_s * 1e3:.0f} ms, idle {it.idle_share:.1%})",
        fontsize=9,
        loc="left",
    )
    ax.tick_params(labelsize=8)
    ax.set_xlabel("seconds", fontsize=8)


def _throughput(ax, results: Mapping[str, SimResult]) -> None:
    names = list(results)
    values = [results[p].tokens_per_s / 1e6 for p in names]
    bars = ax.bar(names, values, color="tab:blue")
    base = results["static"].tokens_per_s / 1e6 if "static" in results else None
    for rect, value in zip(bars, values):
        label = f"{value:.3g}" + (f" ({value / base:.2f}x)" if base else "")
        ax.annotate(
            label,
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("M tokens / s")
    ax.set_ylim(0, max(values) * 1.2)
    ax.tick_params(labelsize=8)


def plot_loss_curves(
    runs: Mapping[str, Sequence[dict[str, Any]]], path: str, title: str = ""
) -> None:
    """Loss against tokens seen, one line per run (``runs``: name -> metrics.jsonl records,
    e.g. from :func:`datacentric.train.reporting.metrics.read_metrics`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for name, records in runs.items():
        seen, total = [], 0
        for record in records:
            total += record["tokens"]
            seen.append(total)
        ax.plot(seen, [r["loss"] for r in records], marker=".", label=name)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
