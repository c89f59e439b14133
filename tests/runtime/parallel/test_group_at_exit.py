"""A process that joined (or met) the ranks through ``process_groups`` and ends without
``destroy_process_group`` has the group destroyed by ``atexit`` while the interpreter
lives (gloo's threads left to the C++ teardown abort a finished rank: SIGABRT,
"terminate called without an active exception")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    import torch.distributed as dist
    from datacentric.parallel.groups import process_groups

    def report():  # registered first: atexit runs it after datacentric's handler
        print("initialized at exit:", dist.is_initialized(), flush=True)

    atexit.register(report)
    if sys.argv[1] == "own":  # the script's own group (accelerate's, a user's)
        dist.init_process_group("gloo", rank=0, world_size=1)
    groups = process_groups()
    assert groups.distributed and groups.world_size == 1
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("who", ["torchrun", "own"])
def test_the_group_is_destroyed_at_exit(who: str) -> None:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, who], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "initialized at exit: False" in done.stdout, done.stdout + done.stderr[-2000:]


def test_joining_the_world_keeps_its_older_path() -> None:
    from datacentric.parallel import groups, launch

    names = ("process_groups", "init_from_env", "backend_for", "destroy_at_exit")
    assert all(getattr(launch, name) is getattr(groups, name) for name in names)
    assert launch.DEFAULT_TIMEOUT_S == groups.DEFAULT_TIMEOUT_S


def test_a_rank_that_never_joins_torchrun_s_world_is_named(monkeypatch) -> None:
    """Rank 0 of 2 whose rank 1 never comes (its node stopped on a refusal before it
    joined): after the collective timeout, one line naming rank 1 and the setting, where
    gloo said 'wait timeout after 2000ms, keys: ...'."""
    import pytest
    import torch.distributed as dist

    from datacentric.parallel.groups import init_from_env
    from datacentric.parallel.launch import free_port

    port = free_port()
    # the store torchrun's agent hosts for its workers
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env |= {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError) as refused:
        init_from_env("gloo", timeout_s=2)
    assert not dist.is_initialized()
    assert str(refused.value) == (
        "rank 1 of 2 did not join within 2 s (parallelism.collective_timeout_s): their node "
        "stopped before it joined (its log says why) or was not started; start every node "
        "with the same command"
    )
    del agent
