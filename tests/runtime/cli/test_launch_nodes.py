"""Two "nodes" on this machine: two torchrun agents meet by c10d rendezvous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_config import SMALL_TRAIN_FLAGS

from datacentric.parallel.launch import free_port
from datacentric.train.reporting.metrics import read_metrics

pytestmark = pytest.mark.slow


def _agent(node_rank: int, port: int, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--node-rank",
        str(node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "two-nodes",
        "-m",
        "datacentric",
        "train",
        *SMALL_TRAIN_FLAGS,
        "--iterations",
        "2",
        "--json",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_torchrun_agents_train_as_one_world(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    agents = [_agent(node, port, out) for node in (0, 1)]
    outputs = []
    for agent in agents:
        try:
            stdout, stderr = agent.communicate(timeout=120)
        finally:
            agent.kill()
        assert agent.returncode == 0, stderr[-3000:]
        outputs.append(stdout)
    summaries = [json.loads(line) for o in outputs for line in o.splitlines() if '"out"' in line]
    assert len(summaries) == 1 and summaries[0]["iterations_done"] == 2  # rank 0 reports
    records = read_metrics(out)
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(len(r["rank_compute_s"]) == 2 for r in records)  # a world of two ranks
