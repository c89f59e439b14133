"""Where a run's step records go: the log line, ``metrics.jsonl``, TensorBoard, W&B.

:class:`MetricsLogger` takes one record per optimizer step (the trainer's) and hands it
to every sink the ``[metrics]`` settings choose:

- ``metrics.jsonl`` in the run folder, always (appended: a resumed run continues it);
- a log line for the run's first step, then every ``log_every`` steps, through the
  ``datacentric`` :mod:`logging` logger (:func:`step_line`, torchtitan-style), the
  last step's line and each line of a step that validated (its ``val_loss``);
- a progress bar, only when stderr is an interactive terminal and ``progress`` is on;
- TensorBoard scalars under ``<out>/tb`` when ``tensorboard`` is on and installed;
- Weights & Biases when ``wandb`` is on (``wandb_mode = "offline"`` writes under
  ``<out>/wandb`` without network).

Only rank 0 writes records; :func:`setup_logging` decides which ranks log.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from datacentric.log import LOGGER_NAME, StderrHandler
from datacentric.progress import TimeLeft, elapsed_text
from datacentric.regular_files import open_regular, read_regular_text

#: Scalars of a record that go to TensorBoard and W&B.
SCALARS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "peak_memory_bytes",
    "optimizer_state_bytes",
    "data_wait_s",
    "schedule_wait_s",
    "iteration_time_s",
    "est_makespan_s",
    "est_idle_share",
    "measured_idle_share",
    "val_loss",
    "val_time_s",
)

GIB = 1024**3

logger = logging.getLogger(LOGGER_NAME)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(level: str = "info", rank: int = 0, all_ranks: bool = False) -> None:
    """Send the ``datacentric`` logger to stderr at ``level`` on rank 0 (every rank with
    ``all_ranks``, each line prefixed by its rank); other ranks log warnings and errors.
    Idempotent: a second call replaces the handler this function installed."""
    wanted = logging.getLevelName(level.upper())
    logger.setLevel(wanted if rank == 0 or all_ranks else max(wanted, logging.WARNING))
    for handler in list(logger.handlers):
        if getattr(handler, "_datacentric", False):
            logger.removeHandler(handler)
    handler = StderrHandler()
    handler._datacentric = True  # type: ignore[attr-defined]
    prefix = "[rank %(rank)d] " if all_ranks else ""
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    handler.addFilter(_RankFilter(rank))
    logger.addHandler(handler)
    logger.propagate = False


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f}ms" if value < 1 else f"{value:.3f}s"


def step_line(
    record: dict[str, Any], memory_capacity_bytes: int | None = None, left_s: float | None = None
) -> str:
    """One step as a log line: step, loss, grad norm, tokens/s, MFU, peak memory in GiB
    and as a share of ``memory_capacity_bytes``, data wait, the measured step time
    beside the schedule's estimate (``est``), and the run's time left (``left_s``: from
    the measured steps, :class:`~datacentric.progress.TimeLeft`)."""
    parts = [f"step {record['iteration'] + 1:>5}", f"loss {record['loss']:8.4f}"]
    norm = record.get("grad_norm")
    parts.append(f"grad_norm {norm:7.4f}" if norm is not None else "grad_norm -")
    parts.append(f"tokens/s {record['tokens_per_s']:>9,.0f}")
    mfu = record.get("mfu")
    parts.append(f"mfu {mfu:6.2%}" if mfu is not None else "mfu -")
    peak = record.get("peak_memory_bytes")
    if peak is not None:
        memory = f"memory {peak / GIB:6.2f}GiB"
        if memory_capacity_bytes:
            memory += f" ({peak / memory_capacity_bytes:5.1%})"
        parts.append(memory)
    parts.append(f"data_wait {_seconds(record.get('data_wait_s'))}")
    parts.append(
        f"step_time {_seconds(record.get('iteration_time_s'))} "
        f"(est {_seconds(record.get('est_makespan_s'))})"
    )
    if record.get("val_loss") is not None:
        val_time = _seconds(record.get("val_time_s"))
        parts.append(f"val_loss {record['val_loss']:8.4f} (val_time {val_time})")
    if left_s is not None:
        parts.append(f"about {elapsed_text(left_s)} left")
    return "  ".join(parts)


class MetricsLogger:
    """Hands each step record to the sinks the settings choose (see the module docstring).

    ``enabled`` is False on ranks other than 0: nothing is written there. ``total`` and
    ``initial`` size the progress bar (steps of the run, steps already done)."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        enabled: bool,
        total: int | None,
        initial: int = 0,
        progress: bool = True,
        log_every: int = 0,
        tensorboard: bool = True,
        wandb: dict[str, Any] | None = None,
        memory_capacity_bytes: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.total = total
        self.log_every = log_every
        self.initial = initial
        self.memory_capacity_bytes = memory_capacity_bytes
        self.left = TimeLeft(total, start=time.monotonic(), done=initial) if total else None
        """The run's time left, from the wall time of its steps so far (validation and
        saves included: they recur)."""
        self._file = None
        self._bar = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._file = open_regular(out / "metrics.jsonl", "a")
        if progress and sys.stderr.isatty():
            self._bar = tqdm(
                total=total,
                initial=initial,
                desc="train",
                unit="step",
                dynamic_ncols=True,
                disable=False,  # TQDM_DISABLE (log.QUIET_ENV) is for other libraries' bars
            )
        if tensorboard:
            self._tb = _tensorboard_writer(out / "tb", initial)
        if wandb is not None:
            self._wandb = _wandb_run(out, resumed=initial > 0, **wandb)

    def log(self, record: dict[str, Any]) -> None:
        """Write one step's record to every sink."""
        if not self.enabled:
            return
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        number = record["iteration"] + 1
        last = self.total is not None and number >= self.total
        first = number == self.initial + 1  # step 1, or a resumed run's first
        validated = record.get("val_loss") is not None
        now = time.monotonic()
        if self.left is not None:
            self.left.reached(number, now)
        if self.log_every and (first or number % self.log_every == 0 or last or validated):
            left = self.left.seconds(now) if self.left is not None else None
            line = step_line(record, self.memory_capacity_bytes, left)
            if self._bar is not None:
                self._bar.write(line, file=sys.stderr)
            else:
                logger.info(line)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}"
            )
        scalars = {k: record[k] for k in SCALARS if record.get(k) is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, record["iteration"])
        if self._wandb is not None:
            self._wandb.log(scalars, step=record["iteration"])

    def log_validation(self, record: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """A validation run after its step's record was written (a resumed run's owed
        one, whose ``val_loss`` the caller added to that step's ``metrics.jsonl`` line):
        its log line, its scalars to TensorBoard and W&B at that step, and its prompts'
        completions or renders (:meth:`log_samples`)."""
        if not self.enabled:
            return
        number = record["iteration"] + 1
        if record.get("val_loss") is not None:
            val_time = _seconds(record.get("val_time_s"))
            logger.info(
                "step %5d  val_loss %8.4f (val_time %s; the validation a stop cut short)",
                number,
                record["val_loss"],
                val_time,
            )
        scalars = {k: record[k] for k in ("val_loss", "val_time_s") if record.get(k) is not None}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, record["iteration"])
        if self._wandb is not None and scalars:
            self._wandb.log(scalars, step=record["iteration"])
        self.log_samples(number, samples)

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """The validation prompts' completions or renders after ``step`` (from 1): one log
        line each, and in TensorBoard under ``validation/prompt-K`` the completion's text
        or the render's frame grid (an image summary); W&B gets a table of completions or
        each render (the video itself)."""
        if not self.enabled:
            return
        for sample in samples:
            shown = sample["path"] if "path" in sample else repr(sample["completion"][:200])
            logger.info(
                "validation step %d prompt %d: %r -> %s",
                step,
                sample["prompt_id"],
                sample["prompt"][:80],
                shown,
            )
            if self._tb is None:
                continue
            tag = f"validation/prompt-{sample['prompt_id']}"
            if "grid" in sample:
                self._tb.add_image(tag, sample["grid"], step - 1, dataformats="HWC")
            else:
                text = f"{sample['prompt']} ->\n\n{sample['completion']}"
                self._tb.add_text(tag, text, step - 1)
        if self._wandb is not None and samples:
            self._wandb.log(_wandb_samples(samples), step=step - 1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _tensorboard_writer(log_dir: Path, initial: int = 0) -> Any:
    """A TensorBoard ``SummaryWriter``, or None when tensorboard is not installed. A
    resumed run (``initial`` steps done) runs the steps after its checkpoint again, so
    TensorBoard is told to drop what ``log_dir`` holds from step ``initial`` on (as
    ``metrics.jsonl`` drops their lines); 0 included: a start that found no checkpoint
    in a folder an earlier attempt logged steps to drops them all."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # noqa: BLE001 - tensorboard is optional
        logger.debug("tensorboard is not installed: no TensorBoard scalars")
        return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=initial)


def _wandb_run(
    out: Path, *, project: str, mode: str, config: dict[str, Any], resumed: bool = False
) -> Any:
    """A W&B run writing under ``out/wandb`` (``mode``: ``online`` or ``offline``): a
    resumed run (``resumed``) continues the W&B run its folder's first start opened
    (:func:`wandb_run_id`), whose steps W&B moves only forward: the steps a resume runs
    again keep the values W&B already holds (``metrics.jsonl`` and TensorBoard hold the
    new ones)."""
    try:
        import wandb
    except ImportError:
        raise ValueError(
            "metrics.wandb: the wandb package is not installed; "
            "pip install 'datacentric[wandb]' or set --no-wandb"
        ) from None
    (out / "wandb").mkdir(parents=True, exist_ok=True)
    run_id = wandb_run_id(out / "wandb" / WANDB_ID_FILE, resumed)
    return wandb.init(
        project=project,
        mode=mode,
        dir=str(out),
        name=out.name,
        config=config,
        id=run_id,
        resume="allow",
    )


#: The file under a run folder's ``wandb/`` that names its W&B run.
WANDB_ID_FILE = "run_id"


def wandb_run_id(path: Path, resumed: bool) -> str:
    """The W&B run id of a run folder, kept in ``path``: a resumed run's is the one its
    first start wrote there (if it did); a fresh start (or ``--overwrite``) writes a new
    one. A file that holds no id is one line naming it."""
    if resumed and path.exists():
        found = read_regular_text(path).strip()
        if not re.fullmatch("[0-9a-z]{1,64}", found):
            raise ValueError(
                f"{path}: holds no W&B run id ({found[:40]!r}); delete it to start a new "
                "W&B run for this run folder"
            )
        return found
    run_id = secrets.token_hex(8)
    path.write_text(run_id + "\n", encoding="utf-8")
    return run_id


def wandb_settings(metrics: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """The W&B arguments of the ``[metrics]`` section (None: W&B is off); ``record``: the
    run's settings by section, which W&B keeps as the run's config."""
    if not metrics.wandb:
        return None
    return {"project": metrics.wandb_project, "mode": metrics.wandb_mode, "config": record}


def _wandb_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """W&B values of validation samples: a table of completions, or each render (a video,
    or an image) under ``validation/prompt-K``."""
    import wandb

    if "path" not in samples[0]:
        rows = [[s["prompt_id"], s["prompt"], s["completion"]] for s in samples]
        table = wandb.Table(columns=["prompt_id", "prompt", "completion"], data=rows)
        return {"validation/samples": table}
    media = {}
    for sample in samples:
        kind = wandb.Video if sample["path"].endswith(".mp4") else wandb.Image
        media[f"validation/prompt-{sample['prompt_id']}"] = kind(
            sample["path"], caption=sample["prompt"]
        )
    return media
