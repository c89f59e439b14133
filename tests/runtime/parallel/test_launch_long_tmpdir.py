"""Ranks start under a long ``TMPDIR`` (a cluster job's scratch folder): the
forkserver's socket is bound below the temporary folder, and AF_UNIX paths hold 107
bytes, so a folder of about 75 bytes or more failed every launch with ``OSError: AF_UNIX
path too long``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from repo_paths import ROOT

LAUNCH = """
    import sys
    import torch.distributed as dist
    from datacentric.parallel import rank_processes
    from datacentric.parallel.launch import spawn
    if sys.argv[1] == "none":
        rank_processes.SHORT_TEMP_FOLDERS = ()
    try:
        print(spawn(dist.get_rank, 2, timeout_s=120))
    except OSError as err:
        print("refused:", err)
"""


def _long_folder(tmp_path: Path) -> Path:
    folder = tmp_path
    while len(os.fsencode(folder)) < 100:
        folder = folder / "scratch-of-a-cluster-job"
    folder.mkdir(parents=True)
    return folder


def _launch(tmp_path: Path, short: str) -> str:
    env = dict(os.environ, TMPDIR=str(_long_folder(tmp_path)), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LAUNCH), short],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_ranks_start_under_a_temporary_folder_too_long_for_a_socket(tmp_path):
    assert _launch(tmp_path, "tmp") == "[0, 1]"


def test_with_no_short_folder_the_refusal_names_tmpdir(tmp_path):
    line = _launch(tmp_path, "none")
    assert line.startswith("refused: the temporary folder ") and "set TMPDIR" in line, line
