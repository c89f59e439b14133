"""Figures of simulated schedules (matplotlib, Agg backend: no display needed).

:func:`plot_results` draws, for each policy, a Gantt chart of one representative
iteration drawn from the result's spans (ranks on the y axis, micro-batches as bars
coloured by log tokens, the gradient all-reduce in grey, idle time blank) and, below,
a bar chart of throughput with each policy's speedup over ``static``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from datacentric.sim.engine import IterationResult, SimResult
from datacentric.timing import PASS_KINDS, SYNC, Span


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
    for ax, policy in zip(axes[:-1, 0], policies):
        _gantt(ax, results[policy], policy, norm, cmap)
    bar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes[:-1, 0]))
    bar.set_label("log10 tokens of the micro-batch")
    _throughput(axes[-1, 0], results)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gantt(ax, result: SimResult, policy: str, norm, cmap) -> None:
    it = representative_iteration(result)
    passes: dict[tuple[int, int], list[Span]] = {}
    for span in result.spans:
        if span.iteration != it.index:
            continue
        if span.kind in PASS_KINDS:
            passes.setdefault((span.micro_batch, span.rank), []).append(span)
        elif span.kind == SYNC and span.duration_s > 0:
            bar = [(span.start_s - it.start_s, span.duration_s)]
            ax.broken_barh(bar, (span.rank, 1), facecolors="0.6")
    for (mb_id, rank), spans in passes.items():
        start = min(s.start_s for s in spans)
        end = max(s.end_s for s in spans)
        ax.broken_barh(
            [(start - it.start_s, end - start)],
            (rank, 1),
            facecolors=cmap(norm(math.log10(max(1, result.micro_batches[mb_id].tokens)))),
            edgecolors="white",
            linewidth=0.4,
        )
    ax.set_xlim(0, it.time_s * 1.01)
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
