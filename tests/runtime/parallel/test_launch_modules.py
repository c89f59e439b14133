"""``datacentric.parallel.launch`` keeps every name it had before its concerns moved to
modules beside it, each the very object of its new home, and the names a test patches
there still reach the code that uses them."""

from __future__ import annotations

import importlib

import pytest
from moved_names import assert_given_as_defined

#: each name ``launch`` held before the split that lives elsewhere now, and where
HOMES = {
    "PEER_REPORT_WAIT_S": "rank_failure",
    "RankFailure": "rank_failure",
    "RELAYED_SIGINT": "start_stops",
    "StoppedAtStart": "start_stops",
    "stop_requested_at_start": "start_stops",
    "stop_signal_at_start": "start_stops",
    "SIGINT_GRACE_S": "rank_processes",
    "DEFAULT_TIMEOUT_S": "groups",
    "backend_for": "groups",
    "default_device": "groups",
    "destroy_at_exit": "groups",
    "device_for_backend": "groups",
    "init_from_env": "groups",
    "process_groups": "groups",
    "under_torchrun": "groups",
}
#: the names ``launch`` still defines: the entry points and the launcher's loop over its
#: ranks (``_start_rank`` and ``_collect``: a test patches the one, a registry names the
#: other by this module)
KEPT = [
    "JOB_TIMEOUT_S",
    "LaunchMode",
    "cpu_cores",
    "free_port",
    "launch",
    "launch_mode",
    "oversubscription_note",
    "spawn",
    "_collect",
    "_start_rank",
]
PACKAGE = "datacentric.parallel"


@pytest.mark.parametrize("name", sorted(HOMES))
def test_launch_still_gives_each_name_as_its_new_home_defines_it(name):
    assert_given_as_defined(f"{PACKAGE}.launch", f"{PACKAGE}.{HOMES[name]}", name)


def test_launch_lists_exactly_those_names_and_defines_its_own():
    launch = importlib.import_module(f"{PACKAGE}.launch")
    assert sorted(launch.__all__) == sorted([*HOMES, *KEPT])
    for name in KEPT:
        assert name.isupper() or getattr(launch, name).__module__ == launch.__name__


def test_a_patch_of_launch_s_start_rank_reaches_spawn(monkeypatch):
    """``spawn`` starts each rank through ``launch._start_rank``, as the tests that patch
    it expect (``launch.cpu_cores``: tests/runtime/parallel/test_launch_note.py)."""
    launch = importlib.import_module(f"{PACKAGE}.launch")
    started: list[int] = []
    start = launch._start_rank

    def counted(context, rank, *args, **kwargs):
        started.append(rank)
        return start(context, rank, *args, **kwargs)

    monkeypatch.setattr(launch, "_start_rank", counted)
    assert launch.spawn(_rank, 2, timeout_s=120) == [0, 1]
    assert started == [0, 1]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()
