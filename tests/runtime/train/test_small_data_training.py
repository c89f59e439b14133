"""A small dataset trains: its global batch is sized from its samples, several steps an
epoch, and the schedule is traced (the whole ``train`` command, in a child process)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from repo_paths import ROOT


@pytest.mark.slow
def test_sixty_short_documents_train_several_steps_and_trace_the_schedule(tmp_path):
    docs = tmp_path / "docs.jsonl"
    words = "data centric parallel training of short documents".split()
    lines = [json.dumps({"text": " ".join(words[: 2 + i % 6] * 3)}) for i in range(60)]
    docs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    argv = ["train", "--dataset", f"jsonl:{docs}", "--world", "2", "--epochs", "1"]
    argv += ["--trace-steps", "2", "--out", str(out), "--cost-model", "analytic", "--json"]
    argv += ["--no-plots", "--no-tensorboard", "--model-arg", "num_layers=2"]
    done = subprocess.run(
        [sys.executable, "-m", "datacentric", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["iterations_done"] >= 4 and summary["samples_seen"] == 60
    assert "global batch sized to" in done.stderr
    assert re.search(r"^step +1 +loss", done.stderr, re.MULTILINE), done.stderr
    assert "global_batch_tokens = " in (out / "config.toml").read_text()
    events = json.loads((out / "traces" / "step-2-rank0.json").read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert any(re.match(r"datacentric: micro-batch \d+/\d+ sp [12] ", n) for n in names), names
