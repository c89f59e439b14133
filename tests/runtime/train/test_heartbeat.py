"""The heartbeat of the ranks :func:`spawn` starts: its records take a bounded room in
the launch's rendezvous folder however long the run beats (the folder's store file, a
``FileStore``, kept every beat before, 80-90 bytes a rank a second), and a peer is
still named stopped or alive after a timeout, from those records or, without the
folder, from the job's store."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch.distributed as dist

from datacentric.parallel.groups import ProcessGroups
from datacentric.parallel.launch import spawn
from datacentric.parallel.rank_entry import RENDEZVOUS_FOLDER
from datacentric.train.reporting.heartbeat import Heartbeat

pytestmark = pytest.mark.usefixtures("one_thread")

PHASE = "step 12: micro-batch 3 (FSDP all-gather)"


def _folder_bytes() -> int:
    """The bytes of every file in this launch's rendezvous folder (its store's file too)."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    folder = os.path.dirname(store.path)
    return sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())


def _beating(beats: tuple[int, ...]) -> list[int]:
    """The rendezvous folder's bytes after each number of beats in ``beats`` (both
    ranks beat, then meet, before each count)."""
    heartbeat = Heartbeat(ProcessGroups(), lambda: PHASE, period_s=0.01)
    sizes = []
    for count in beats:
        while heartbeat._count < count:
            assert heartbeat.publish()
        dist.barrier()
        sizes.append(_folder_bytes())
        dist.barrier()
    return sizes


def test_the_rendezvous_folder_does_not_grow_with_the_beats():
    sizes = spawn(_beating, 2, (10, 100, 1000), timeout_s=120)
    # before: 1,000 beats of two ranks had added 178,024 bytes to the store's file
    assert sizes[0] == sizes[1], sizes
    few, some, many = sizes[0]
    assert many - few <= 2 * 3, sizes  # two ranks' beat counters, three digits longer


def _peer_named(beating: bool, with_folder: bool) -> str:
    """What rank 0's heartbeat says of rank 1, which beats (or stopped) meanwhile."""
    if not with_folder:  # as under torchrun: the beats go through the job's store
        os.environ.pop(RENDEZVOUS_FOLDER)
    groups = ProcessGroups()
    heartbeat = Heartbeat(groups, lambda: f"phase of rank {groups.rank}", period_s=0.1)
    assert heartbeat.publish()
    dist.barrier()
    if groups.rank == 1:
        with heartbeat if beating else contextlib.nullcontext():
            dist.barrier()  # while rank 0 reads the beats
        return ""
    said = heartbeat.describe_peers()
    dist.barrier()
    kept = os.path.exists(os.path.join(os.environ.get(RENDEZVOUS_FOLDER, ""), "heartbeat-1"))
    assert kept == with_folder  # the records are files in the folder, else keys of the store
    return said


@pytest.mark.parametrize("with_folder", [True, False], ids=["folder", "store"])
@pytest.mark.parametrize("beating", [True, False], ids=["alive", "stopped"])
def test_a_peer_is_named_stopped_or_alive(beating, with_folder):
    said = spawn(_peer_named, 2, beating, with_folder, timeout_s=120)[0]
    if beating:
        assert said == "rank 1 is alive in phase of rank 1", said
    else:
        assert said == "rank 1 stopped answering during phase of rank 1", said
