"""Which of an epoch's steps a configuration search prices first.

The baselines that run one configuration for the whole epoch (``static``,
``megatron-dyncp``) search it in two passes: every candidate is priced on a few
steps spread over the epoch (the data order gives each step every bucket in
proportion, so they are alike), then the best few on every step, and the one with
the least estimated epoch time wins.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Steps of the first pass.
SEARCH_STEPS = 4


def priced_steps(num_steps: int, count: int = SEARCH_STEPS) -> list[int]:
    """Up to ``count`` step indices spread evenly over ``num_steps`` steps."""
    if num_steps <= count:
        return list(range(num_steps))
    return sorted({int(k) for k in np.rint(np.linspace(0, num_steps - 1, count))})


def searched(inp: Any, done: float, total: float) -> None:
    """Tell how far a policy's search is, ``done`` of ``total`` steps priced or built,
    to ``inp.on_step.searched(done, total)`` when the step callback has one (a plain
    callable a command's progress line hangs on it: the steps' own count says nothing
    while a search runs before them)."""
    _tell(inp, "searched", done, total)


def step_begun(inp: Any, work: float) -> None:
    """Tell ``inp.on_step.step_begun(work)``, when the step callback has one, that the
    step now built has about ``work`` micro-batches to lay out (each layout tried counts
    its micro-batches): a command's time left then moves within a step, where an
    epoch's few steps (one, on a large world) would leave it blank for most of the work."""
    _tell(inp, "step_begun", work)


def laid_out(inp: Any, count: int) -> None:
    """Tell ``inp.on_step.laid_out(count)``, when the step callback has one, that the
    step now built has laid out ``count`` more micro-batches (:func:`step_begun`)."""
    _tell(inp, "laid_out", count)


def solved(inp: Any, seconds: float) -> None:
    """Tell ``inp.on_step.solved(seconds)``, when the step callback has one, that the
    step now built has spent ``seconds`` of CPU in a solve its told work does not count
    (``dcp-opt``'s exact solver: a millisecond on most steps, 0.9-1.9 s on a phase of
    about 22 long micro-batches of ``longctx-1m`` at 64 GPUs, most of that step):
    :class:`~datacentric.progress.StepShare` counts it in the step's own unit."""
    _tell(inp, "solved", seconds)


def set_aside(inp: Any, seconds: float) -> None:
    """Tell ``inp.on_step.set_aside(seconds)``, when the step callback has one, that work
    made once for the epoch (a search the later steps reuse) has just taken ``seconds``
    of CPU inside the step now built: the steps' pace leaves it out, as it does not come
    again (``dcp-opt``'s token-packed step makers: 0.47 s of a 0.74 s first step on
    opensora-long at 32 GPUs, whose other steps take about 0.25 s)."""
    _tell(inp, "set_aside", seconds)


def _tell(inp: Any, news: str, *args: float) -> None:
    told = getattr(inp.on_step, news, None)
    if told is not None:
        told(*args)
