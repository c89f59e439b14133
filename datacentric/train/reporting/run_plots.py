"""Figures of a training run, drawn from its ``metrics.jsonl`` (matplotlib, Agg backend).

:func:`plot_run` writes into ``<run>/plots/``:

- ``step_time.png``: each step's measured time (the trainer's wall clock, data wait
  included) beside the schedule's estimate (``est_makespan_s``, the cost model's
  makespan of the step's groups), captioned with the cost model the run used (read
  from its ``config.json``: the analytic model prices an idle machine at peak rates, so
  a steady gap to the measured time is expected);
- ``idle_share.png``: the share of rank time idle per step, estimated by the schedule
  and measured (from each rank's compute time over the runtime's wall time);
- ``loss.png``: the training loss per step, and the held-out loss at the steps that
  validated (``[validation]``).

The trainer calls it when a run ends (``[metrics] plots``); ``datacentric plot RUN``
redraws the figures of any run folder.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from datacentric.regular_files import read_json_file
from datacentric.settings.run_settings import record_sections
from datacentric.train.reporting.metric_sinks import logger
from datacentric.train.reporting.metrics import read_metrics

#: The figures :func:`plot_run` writes under ``<run>/plots/``: file, y label, title,
#: and the lines drawn (label -> the record's key).
FIGURES: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    (
        "step_time.png",
        "seconds",
        "step time, measured vs estimated",
        {"measured": "iteration_time_s", "estimated (schedule)": "est_makespan_s"},
    ),
    (
        "idle_share.png",
        "idle share of rank time",
        "idle share per step",
        {"measured": "measured_idle_share", "estimated (schedule)": "est_idle_share"},
    ),
    ("loss.png", "loss", "loss", {"training": "loss", "validation (held out)": "val_loss"}),
)
PLOT_FILES = tuple(f[0] for f in FIGURES)

#: The step-time figure's caption, by the run's ``[cost] cost_model`` (None: not recorded).
ESTIMATE_CAPTIONS: dict[str | None, str] = {
    "analytic": (
        "estimated: the analytic cost model (FLOPs and bytes at the device's peak rates "
        "on an idle machine), so a steady gap to the measured time is expected"
    ),
    "profile": (
        "estimated: the cost model fitted to this run's profile ([cost] profile_dir); "
        "measured includes data wait and host overhead it does not price"
    ),
    None: (
        "estimated: the schedule's cost model (config.json gives no [cost] cost_model); "
        "measured includes data wait and host overhead"
    ),
}


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw the run's figures (see the module docstring); returns their paths.

    Raises ``ValueError`` when the folder has no step records, ``ImportError`` when
    matplotlib is missing."""
    records = read_metrics(run_dir)
    if not records:
        raise ValueError(f"{run_dir}: no metrics.jsonl records (is it a run folder?)")
    import matplotlib

    matplotlib.use("Agg")
    folder = Path(run_dir) / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    steps = [r["iteration"] + 1 for r in records]
    name = Path(run_dir).name
    caption = step_time_caption(run_dir)
    return [
        _lines(
            folder / file,
            steps,
            {label: [r.get(key) for r in records] for label, key in lines.items()},
            ylabel,
            f"{name}: {title}",
            caption if file == "step_time.png" else None,
        )
        for file, ylabel, title, lines in FIGURES
    ]


def draw_run_plots(out: Path) -> None:
    """The run's figures (``plots/``) at its end, listed in the log; a missing
    matplotlib is a note, not a failure."""
    try:
        paths = plot_run(out)
    except ImportError:
        logger.info("note: no plots (matplotlib is not installed: pip install 'datacentric[plot]')")
        return
    except ValueError:  # no step ran
        return
    logger.info("plots: %s", ", ".join(str(p) for p in paths))


def step_time_caption(run_dir: str | Path) -> str:
    """What the step-time figure's estimate is: the run's ``[cost] cost_model`` read from
    its ``config.json`` (:data:`ESTIMATE_CAPTIONS`; the unknown caption when the file is
    missing or unreadable, since a figure must not fail on it)."""
    try:
        sections = record_sections(read_json_file(Path(run_dir) / "config.json"), str(run_dir))
        model = sections.get("cost", {}).get("cost_model")
    except (OSError, ValueError, AttributeError):
        model = None
    return ESTIMATE_CAPTIONS.get(model, ESTIMATE_CAPTIONS[None])


def _lines(
    path: Path,
    steps: Sequence[int],
    series: dict[str, Sequence[Any]],
    ylabel: str,
    title: str,
    caption: str | None = None,
) -> Path:
    """One figure of ``series`` (label -> value per step; None values are left out),
    ``caption`` under it when given."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    drawn = 0
    for label, values in series.items():
        points = [(s, v) for s, v in zip(steps, values) if v is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=label)
            drawn += 1
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if drawn > 1:  # a legend of the lines drawn (a series without a value draws none)
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if caption:
        fig.supxlabel(textwrap.fill(caption, 100), fontsize=7)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
