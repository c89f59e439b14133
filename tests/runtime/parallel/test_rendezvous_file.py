"""The ranks of :func:`spawn` meet by a file in a private folder of their own, not on a
port: a port picked free and bound later by rank 0 could be taken in between by another
program (the run then failed at its start). The folder goes once the ranks end, however
they end."""

from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from datacentric.parallel import launch
from datacentric.parallel.launch import RankFailure, spawn

pytestmark = pytest.mark.usefixtures("one_thread")


def _job_store() -> dist.Store:
    """The store under this rank's default process group."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _rendezvous() -> tuple[str, str, int]:
    """The kind of store this rank met its peers by, its file, and its folder's mode."""
    store = _job_store()
    dist.barrier(group=dist.new_group(list(range(dist.get_world_size()))))
    path = getattr(store, "path", "")
    mode = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) if path else -1
    return type(store).__name__, path, mode


def _failing_after_meeting() -> None:
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("planted failure")


def _hanging() -> None:
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def _stopping_the_launcher(launcher_pid: int) -> None:
    if dist.get_rank() == 0:
        os.kill(launcher_pid, signal.SIGTERM)
    time.sleep(600)


def _waiting_for_a_key_never_set() -> float:
    started = time.monotonic()
    try:
        _job_store().get("never set")
    except RuntimeError as err:  # FileStore's: "Timeout waiting for key: ... after 2000 ms"
        assert "timeout" in str(err).lower(), err
        return time.monotonic() - started
    return -1.0


@pytest.fixture
def folders(monkeypatch) -> list[Path]:
    """Every rendezvous folder ``tempfile.mkdtemp`` makes during the test."""
    made: list[Path] = []
    mkdtemp = tempfile.mkdtemp

    def recording(*args, **kwargs) -> str:
        folder = mkdtemp(*args, **kwargs)
        if "rendezvous" in Path(folder).name:
            made.append(Path(folder))
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    return made


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_meet_by_a_private_file_that_is_gone_after_them(world, folders):
    met = spawn(_rendezvous, world, timeout_s=120)
    kinds, paths, modes = zip(*met, strict=True)
    assert set(kinds) == {"FileStore"} and len(set(paths)) == 1, met
    assert set(modes) == {0o700}, met
    assert folders == [Path(paths[0]).parent]
    assert not folders[0].exists()


def test_spawn_starts_while_the_port_a_pick_gives_is_taken(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        # another program holds the port that free_port would pick
        monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": port)
        met = spawn(_rendezvous, 2, timeout_s=120)
    assert [kind for kind, _, _ in met] == ["FileStore", "FileStore"]


def test_the_folder_is_gone_after_a_rank_fails(folders):
    with pytest.raises(RankFailure, match="rank 1 failed: ValueError: planted failure"):
        spawn(_failing_after_meeting, 2, timeout_s=120)
    assert len(folders) == 1 and not folders[0].exists()


def test_the_folder_is_gone_after_a_timeout(folders):
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish"):
        spawn(_hanging, 2, timeout_s=5, collective_timeout_s=120)
    assert len(folders) == 1 and not folders[0].exists()


def test_the_folder_is_gone_after_a_signal_to_the_launcher(folders):
    with pytest.raises(SystemExit) as stopped:
        spawn(_stopping_the_launcher, 2, os.getpid(), timeout_s=120)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert len(folders) == 1 and not folders[0].exists()


def test_the_store_waits_as_long_as_the_collective_timeout(folders):
    waited = spawn(_waiting_for_a_key_never_set, 2, timeout_s=120, collective_timeout_s=2)
    assert all(1.5 <= s < 30 for s in waited), waited
