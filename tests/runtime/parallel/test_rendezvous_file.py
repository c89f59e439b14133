"""The ranks of :func:`spawn` meet by a file in a private folder of their own, not on a
port: a port picked free and bound later by rank 0 could be taken in between by another
program (the run then failed at its start). The folder goes once the ranks end, however
they end."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

from datacentric.parallel import launch, rank_entry
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


class _SlowGets(dist.Store):
    """A store whose reads wait ``delay_s`` first: rank 0's, slow to take its peers'
    gloo connections while they have started and gone."""

    def __init__(self, inner: dist.Store, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        time.sleep(self.delay_s)
        return self.inner.get(key)

    def add(self, key, amount):
        return self.inner.add(key, amount)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def clone(self):
        return _SlowGets(self.inner.clone(), self.delay_s)


_KEPT: list[dist.Store] = []


def _slow_rank_zero(url: str, **kwargs):
    """``slowfile://PATH?rank=R&world_size=N``: a FileStore, slow to read on rank 0."""
    parts = urlparse(url)
    query = dict(item.split("=") for item in parts.query.split("&"))
    rank, world = int(query["rank"]), int(query["world_size"])
    slow = _SlowGets(dist.FileStore(parts.path, world), 0.5 if rank == 0 else 0.0)
    _KEPT.append(slow)  # a store written in Python lives while Python holds it
    yield slow, rank, world
    raise RuntimeError("no second rendezvous")


register_rendezvous_handler("slowfile", _slow_rank_zero)


def _start_and_leave(rank: int, path: str, world: int, report) -> None:
    """Start as a spawned rank does, then leave at once (work without a collective)."""
    try:
        init = f"slowfile://{path}"
        rank_entry._init_every_rank("gloo", init, rank, world, timeout_s=60)
        report.put((rank, "ok"))
    except Exception as err:  # noqa: BLE001 - the test counts them
        report.put((rank, str(err).splitlines()[0]))


def test_no_rank_leaves_before_every_rank_has_started(tmp_path):
    """A rank with no collective to run used to end while rank 0 was still taking its
    connection, and rank 0's start failed ('Gloo connectFullMesh failed ... Connection
    closed by peer': 3 of 10 tries at world 2 without the barrier)."""
    context = multiprocessing.get_context("fork")
    for attempt in range(6):
        report = context.Queue()
        path = str(tmp_path / f"rendezvous-{attempt}")
        ranks = [
            context.Process(target=_start_and_leave, args=(rank, path, 3, report))
            for rank in range(3)
        ]
        for process in ranks:
            process.start()
        ended = dict(report.get(timeout=120) for _ in ranks)
        for process in ranks:
            process.join(timeout=30)
        assert ended == {0: "ok", 1: "ok", 2: "ok"}, (attempt, ended)
    assert "TORCH_DIST_INIT_BARRIER" not in os.environ
