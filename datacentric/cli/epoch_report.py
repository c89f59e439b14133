"""The headline ``schedule`` and ``simulate`` print for a policy's epoch: its time and
its efficiency against the ideal bound. No command owns this module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def policy_report(
    rows: dict[str, dict[str, Any]],
    epoch_key: str,
    how: str,
    header: str,
    row_text: Callable[[str, dict[str, Any]], str],
) -> list[str]:
    """Each policy's :func:`epoch_headline` (its row's epoch time under ``epoch_key``,
    ``efficiency`` and ``ideal_epoch_time_s``), a blank line, then a table: ``header``
    and ``row_text(policy, row)`` per policy."""
    lines = [
        epoch_headline(p, r[epoch_key], r["efficiency"], r["ideal_epoch_time_s"], how)
        for p, r in rows.items()
    ]
    return [*lines, "", header, *(row_text(p, r) for p, r in rows.items())]


def epoch_headline(
    policy: str, epoch_s: float, efficiency: float | None, bound_s: float | None, how: str
) -> str:
    """``dcp-opt: one epoch in 1,282.5 s (estimated), efficiency 0.975 of the ideal bound
    (1,249.9 s)``; ``how``: ``estimated`` or ``simulated``."""
    line = (
        f"{policy}: one epoch in {seconds_text(epoch_s)} s ({how}), "
        f"efficiency {ratio_text(efficiency)} of the ideal bound"
    )
    return line + (f" ({seconds_text(bound_s)} s)" if bound_s else "")


def ratio_text(value: float | None) -> str:
    """An efficiency to three decimals, ``-`` when there is none."""
    return "-" if value is None else f"{value:.3f}"


def seconds_text(value: float) -> str:
    """Seconds to a tenth from one second on (``1,282.5``), else three digits."""
    return f"{value:,.1f}" if value >= 1 else f"{value:.3g}"
