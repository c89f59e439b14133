"""What a user watches: the log line, the metric sinks, traces, plots, one checkpoint."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from repo_paths import ROOT

from datacentric.data.sources import skipped_note
from datacentric.train.reporting.metric_sinks import MetricsLogger, setup_logging, step_line
from datacentric.train.reporting.metrics import read_metrics

LINE = re.compile(
    r"step +(\d+) +loss +([\d.]+) +grad_norm +([\d.]+) +tokens/s +([\d,]+) +mfu +([\d.]+)% "
    r"+memory +([\d.]+)GiB \( *([\d.]+)%\) +data_wait \S+ +step_time \S+ \(est \S+\)"
)


@pytest.mark.slow
def test_cpu_config_logs_every_step_traces_plots_and_checkpoints_once(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--config", "examples/configs/cpu.toml", "--out", str(out)]
    argv += ["--metrics.log_every", "1", "--iterations", "2", "--checkpoint-every", "2"]
    argv += ["--trace-steps", "2", "--no-tensorboard"]
    done = subprocess.run(
        [sys.executable, "-m", "datacentric", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    lines = [LINE.search(line) for line in done.stderr.splitlines()]
    lines = [m for m in lines if m]
    records = read_metrics(out)
    assert [int(m.group(1)) for m in lines] == [1, 2] and len(records) == 2
    for match, record in zip(lines, records, strict=True):
        torch.testing.assert_close(float(match.group(2)), record["loss"], atol=1e-4, rtol=0)
        torch.testing.assert_close(float(match.group(3)), record["grad_norm"], atol=1e-4, rtol=0)
        assert float(match.group(6)) == pytest.approx(record["peak_memory_bytes"] / 2**30, abs=0.01)
        assert 0 < float(match.group(5)) and 0 < float(match.group(7)) < 100
    trace = json.loads((out / "traces" / "step-2-rank0.json").read_text())
    assert trace["traceEvents"]
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["step-2-rank0.json"]
    for name in ("step_time.png", "idle_share.png", "loss.png"):
        assert (out / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    # the last step is a multiple of checkpoint_every: one checkpoint, not a second "-r1"
    steps = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step"))
    assert steps == ["step-00000002"]
    assert not (out / "tb").exists()


def record(iteration: int, loss: float = 2.5) -> dict:
    return {
        "iteration": iteration,
        "loss": loss,
        "lr": 1e-3,
        "grad_norm": 1.25,
        "tokens_per_s": 1234.0,
        "mfu": 0.0125,
        "peak_memory_bytes": 3 * 2**30,
        "data_wait_s": 0.002,
        "iteration_time_s": 0.5,
        "est_makespan_s": 0.25,
    }


def test_step_line_holds_what_users_watch():
    line = step_line(record(4), memory_capacity_bytes=12 * 2**30)
    match = LINE.search(line)
    assert match, line
    assert match.groups()[:2] == ("5", "2.5000")  # steps are numbered from 1
    assert (match.group(5), match.group(6), match.group(7)) == ("1.25", "3.00", "25.0")
    assert "step_time 500.0ms (est 250.0ms)" in line and "left" not in line
    assert step_line(record(4), left_s=65.4).endswith("  about 1 min 05 s left")


class Collect(logging.Handler):
    """Every message the ``datacentric`` logger emits, once (whatever other handlers
    earlier tests left on the root logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_log_the_first_step_every_log_every_and_the_last(tmp_path):
    setup_logging("info")
    collect = Collect()
    logging.getLogger("datacentric").addHandler(collect)
    try:
        sink = MetricsLogger(tmp_path, enabled=True, total=5, progress=False, log_every=2)
        for step in range(5):
            sink.log(record(step))
        sink.close()
    finally:
        logging.getLogger("datacentric").removeHandler(collect)
    assert [m.split()[1] for m in collect.messages if m.startswith("step")] == ["1", "2", "4", "5"]
    steps = [m for m in collect.messages if m.startswith("step")]
    assert [m.endswith(" s left") for m in steps] == [True, True, True, False]  # none at the end
    assert len(read_metrics(tmp_path)) == 5
    collect.messages.clear()
    logging.getLogger("datacentric").addHandler(collect)
    try:  # a resumed run logs its own first step
        sink = MetricsLogger(
            tmp_path, enabled=True, total=9, initial=5, progress=False, log_every=4
        )
        for step in range(5, 9):
            sink.log(record(step))
        sink.close()
    finally:
        logging.getLogger("datacentric").removeHandler(collect)
    assert [m.split()[1] for m in collect.messages if m.startswith("step")] == ["6", "8", "9"]


def test_quiet_and_other_ranks_log_warnings_only():
    logger = logging.getLogger("datacentric")
    setup_logging("warning", rank=0)
    assert not logger.isEnabledFor(logging.INFO)
    setup_logging("info", rank=1)
    assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
    setup_logging("info", rank=1, all_ranks=True)
    assert logger.isEnabledFor(logging.INFO)
    setup_logging("info")


def test_wandb_sink_offline(tmp_path, monkeypatch):
    calls: list[tuple] = []

    class Run:
        def log(self, data, step):
            calls.append(("log", dict(data), step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    wandb = {"project": "p", "mode": "offline", "config": {"lr": 1e-3}}
    sink = MetricsLogger(
        tmp_path, enabled=True, total=2, progress=False, tensorboard=False, wandb=wandb
    )
    sink.log(record(0, loss=3.0))
    sink.close()
    assert calls[0][0] == "init" and calls[0][1]["mode"] == "offline"
    assert calls[0][1]["dir"] == str(tmp_path) and calls[0][1]["config"] == {"lr": 1e-3}
    assert calls[1][0] == "log" and calls[1][1]["loss"] == 3.0 and calls[1][2] == 0
    assert calls[-1] == ("finish",)
    # a resumed run continues the W&B run its folder started; a fresh start opens another
    first = calls[0][1]
    assert first["resume"] == "allow" and re.fullmatch("[0-9a-f]{16}", first["id"]), first
    ids = []
    for initial in (1, 0):
        calls.clear()
        MetricsLogger(
            tmp_path,
            enabled=True,
            total=2,
            initial=initial,
            progress=False,
            tensorboard=False,
            wandb=wandb,
        ).close()
        ids.append(calls[0][1]["id"])
    assert ids[0] == first["id"] != ids[1], ids
    (tmp_path / "wandb" / "run_id").write_text("not an id!\n")
    with pytest.raises(ValueError, match="wandb/run_id: holds no W&B run id"):
        MetricsLogger(tmp_path, enabled=True, total=2, initial=1, progress=False, wandb=wandb)


def test_wandb_gets_each_render_as_a_video_or_an_image(tmp_path, monkeypatch):
    """Validation renders (``path``, ``grid``) go to W&B one media object each, under
    ``validation/prompt-K`` at the step's iteration: ``Video`` for an MP4, else ``Image``."""
    calls: list[tuple] = []

    class Run:
        def log(self, data, step):
            calls.append((dict(data), step))

        def finish(self):
            pass

    def media(kind):
        return lambda path, caption: (kind, path, caption)

    fake = types.SimpleNamespace(
        init=lambda **kwargs: Run(), Video=media("video"), Image=media("image")
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    wandb = {"project": "p", "mode": "offline", "config": {}}
    sink = MetricsLogger(
        tmp_path, enabled=True, total=4, progress=False, tensorboard=False, wandb=wandb
    )
    grid = np.zeros((4, 8, 3), dtype=np.uint8)
    renders = [
        {"prompt_id": 0, "prompt": "a cat", "path": "v/step-2/0.mp4", "grid": grid},
        {"prompt_id": 1, "prompt": "a car", "path": "v/step-2/1.png", "grid": grid},
    ]
    sink.log_samples(2, renders)
    sink.close()
    assert calls == [
        (
            {
                "validation/prompt-0": ("video", "v/step-2/0.mp4", "a cat"),
                "validation/prompt-1": ("image", "v/step-2/1.png", "a car"),
            },
            1,
        )
    ]


def test_wandb_missing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(ValueError, match="metrics.wandb: the wandb package is not installed"):
        MetricsLogger(
            tmp_path, enabled=True, total=1, wandb={"project": "p", "mode": "offline", "config": {}}
        )


def test_skip_note_says_why(tmp_path):
    from datacentric.data import DataConfig, open_dataset

    data = tmp_path / "d.jsonl"
    docs = ["", "short", "x" * 50]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    chunked = open_dataset(f"jsonl:{data}", DataConfig(max_tokens=20))
    assert skipped_note(chunked) == "1 sample skipped: 1 empty (no tokens)"
    skipping = open_dataset(f"jsonl:{data}", DataConfig(max_tokens=20, long_docs="skip"))
    assert skipped_note(skipping) == (
        "2 samples skipped: 1 empty (no tokens), 1 longer than data.max_tokens "
        "(data.long_docs = skip)"
    )


def _next_second() -> None:
    """Wait for the clock's next whole second. TensorBoard reads a folder's event files in
    name order, and a name starts with its writer's start second, then a count of the
    writers this process opened (in text: writer 10 sorts before writer 9); two writers
    started in one second of one process, as in a test, can read in the wrong order, which
    a run and its resume, seconds apart, never do."""
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.02)


def test_tensorboard_of_a_resumed_run_holds_each_step_once(tmp_path):
    """A run stopped after step 6 whose last checkpoint is step 4 runs steps 5 and 6 again
    on resume; TensorBoard then reads each step's loss once, the resumed run's (as
    ``metrics.jsonl`` keeps it), not the lost steps' beside them."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    sink = MetricsLogger(tmp_path, enabled=True, total=8, progress=False)
    for step in range(6):
        sink.log(record(step, loss=10.0 + step))
    sink.close()
    _next_second()  # a resume starts later, and TensorBoard reads the files in that order
    sink = MetricsLogger(tmp_path, enabled=True, total=8, initial=4, progress=False)
    for step in range(4, 8):
        sink.log(record(step, loss=1.0 + step))
    sink.close()
    events = accumulator.EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("loss")]
    assert losses == [(0, 10.0), (1, 11.0), (2, 12.0), (3, 13.0)] + [
        (s, 1.0 + s) for s in range(4, 8)
    ]
    # an attempt that logged steps 0-2 and saved no checkpoint, then a start that found
    # none (0 steps done, its metrics.jsonl emptied): the earlier steps go too
    for attempt in ([20.0, 21.0, 22.0], [30.0, 31.0]):
        _next_second()
        sink = MetricsLogger(tmp_path / "again", enabled=True, total=8, progress=False)
        for step, loss in enumerate(attempt):
            sink.log(record(step, loss=loss))
        sink.close()
    events = accumulator.EventAccumulator(str(tmp_path / "again" / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 30.0), (1, 31.0)]
