"""``datacentric plot RUN_DIR``: (re)draw a training run's figures from its metrics.

Writes ``RUN_DIR/plots/step_time.png`` (measured vs estimated step time per step),
``idle_share.png`` and ``loss.png`` (:mod:`datacentric.train.reporting.run_plots`); ``train``
draws the same figures when a run ends (``[metrics] plots``). Needs matplotlib (the
``plot`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="draw a training run's step-time, idle-share and loss figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", help="the run folder (--out of `datacentric train`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datacentric.train.reporting.run_plots import plot_run

    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(f"{args.run_dir}: no such run folder")
    try:
        paths = plot_run(args.run_dir)
    except ImportError:
        raise ValueError("matplotlib is not installed: pip install 'datacentric[plot]'") from None
    for path in paths:
        print(path)
    return 0
