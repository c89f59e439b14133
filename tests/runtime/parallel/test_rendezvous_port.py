"""The ranks of :func:`spawn` meet on a store the launcher bound before they started: a
port that another program holds cannot stop them (a port picked free and bound later by a
rank could be taken in between, and the run failed at its start)."""

from __future__ import annotations

import socket

import torch.distributed as dist

from datacentric.parallel import launch


def _store_port() -> int:
    """The port of the store this rank joined."""
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return int(store.port)


def test_spawn_starts_while_a_picked_free_port_is_taken(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        # the port a pick would have given is in another program's hands
        monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": port)
        ports = launch.spawn(_store_port, 2, timeout_s=60)
    assert ports[0] == ports[1]
    assert ports[0] != port
