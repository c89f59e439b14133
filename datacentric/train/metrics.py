"""Per-iteration metrics: JSON lines, a rank-0 progress bar, optional TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm


class MetricsLogger:
    """Writes one JSON object per optimizer step to ``<out>/metrics.jsonl`` (rank 0 only).

    Appends, so a resumed run continues the same file. Also drives a progress bar
    and, when ``tensorboard`` is installed, TensorBoard scalars under ``<out>/tb``.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        enabled: bool,
        total: int | None,
        initial: int = 0,
        progress: bool = True,
    ) -> None:
        self.enabled = enabled
        self._file = None
        self._bar = None
        self._tb = None
        if not enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._file = open(out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        if progress:
            self._bar = tqdm(
                total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True
            )
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # noqa: BLE001 - tensorboard is optional
            SummaryWriter = None  # noqa: N806
        if SummaryWriter is not None:
            self._tb = SummaryWriter(log_dir=str(out / "tb"))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}"
            )
        if self._tb is not None:
            step = record["iteration"]
            for key in ("loss", "tokens_per_s", "iteration_time_s", "est_idle_share", "lr"):
                if key in record:
                    self._tb.add_scalar(key, record[key], step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's ``metrics.jsonl`` (empty if none)."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
