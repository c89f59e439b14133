"""What every rank of a training run must hold alike, checked when the run starts.

Under torchrun on several nodes each node runs its own command: a node started with
another ``--seed``, another ``--config`` file or other files under the same dataset path
plans other steps from the same collectives, and trains on without a word (or hangs in a
collective the others never call); a node whose ``--out`` is not the folder the others
write (no shared filesystem) saves its part of every checkpoint where no resume finds it.
Two collective checks refuse both before anything is trained or written, in the same
line on every rank (so each node says it once):

- :func:`check_same_run` (when the run is assembled, before any collective it issues):
  every rank's settings (but ``job.out``, which :func:`check_shared_run_folder` checks),
  the shapes of its training samples and the ranks of its node (torchrun's
  ``LOCAL_WORLD_SIZE``: a node is what the plan keeps groups within) are rank 0's;
- :func:`check_shared_run_folder` (once rank 0 holds the run folder's lock): every rank
  reads, in its own ``job.out``, the lock file rank 0's side wrote.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from datacentric.parallel.groups import ProcessGroups, local_world_size
from datacentric.shapes import SampleShape
from datacentric.train.run_folder import LOCK_FILE

_SAME_COMMAND = "start every node with the same command and --config file"


def _gathered(groups: ProcessGroups, value: Any) -> list[Any]:
    """``value`` of every rank, by rank (collective on the world's group)."""
    values: list[Any] = [None] * groups.world_size
    dist.all_gather_object(values, value, group=groups.world)
    return values


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """``section.key`` -> value of sectioned settings (:meth:`TrainConfig.to_json`)."""
    flat: dict[str, Any] = {}
    for section, keys in settings.items():
        if isinstance(keys, dict):
            flat.update({f"{section}.{key}": value for key, value in keys.items()})
        else:
            flat[section] = keys
    return flat


def _where(rank: int, host: str) -> str:
    return f"rank {rank} (host {host})"


def check_same_run(
    groups: ProcessGroups, settings: dict[str, Any], shapes: Sequence[SampleShape]
) -> None:
    """Refuse, on every rank, a run whose ranks were given other settings than rank 0's
    (``settings``: :meth:`~datacentric.settings.TrainConfig.to_json`; ``job.out`` apart),
    read other training samples (``shapes``) or run on nodes of another number of ranks,
    in one ``ValueError`` naming the first rank that differs, its host and the setting.
    Collective; nothing for one process."""
    if not (groups.distributed and groups.world_size > 1):
        return
    flat = {k: v for k, v in _flat(settings).items() if k != "job.out"}
    digest = hashlib.sha256(repr([(s.tokens, s.grid) for s in shapes]).encode()).hexdigest()
    local = local_world_size(dist.get_world_size())  # the ranks of this node
    mine = (flat, digest, len(shapes), socket.gethostname(), local)
    first, *others = _gathered(groups, mine)
    for rank, (theirs, their_digest, count, host, their_local) in enumerate(others, start=1):
        if their_local != first[4]:  # a node is the plan's unit: every node holds as many
            raise ValueError(
                f"{_where(rank, host)} runs on a node of {their_local} rank(s) where rank 0 "
                f"(host {first[3]}) runs on one of {first[4]} (torchrun --nproc-per-node "
                "differs); start every node with the same --nproc-per-node"
            )
        for key in sorted(set(first[0]) | set(theirs)):
            if theirs.get(key) != first[0].get(key):
                raise ValueError(
                    f"{_where(rank, host)} was started with {key} = {theirs.get(key)!r} "
                    f"where rank 0 (host {first[3]}) has {first[0].get(key)!r}; "
                    f"{_SAME_COMMAND}"
                )
        if their_digest != first[1]:
            dataset = first[0].get("data.dataset")
            raise ValueError(
                f"{_where(rank, host)} reads other training samples under data.dataset "
                f"{dataset!r} than rank 0 (host {first[3]}): {count} samples against "
                f"{first[2]}, or other lengths; give every node the same files"
            )


def check_shared_run_folder(groups: ProcessGroups, out: str | Path) -> None:
    """Refuse, on every rank, a run whose ranks do not all see the run folder rank 0
    writes: each reads ``out``'s lock file (rank 0's side holds it by now, naming its
    host and process) after the others came here, and one that reads another (or none)
    is named with its host in one ``ValueError`` (no shared filesystem, or another
    ``--out``). Collective; nothing for one process."""
    if not (groups.distributed and groups.world_size > 1):
        return
    _gathered(groups, None)  # rank 0's side holds the lock before anyone reads it
    try:
        seen = (Path(out) / LOCK_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    first, *others = _gathered(groups, (seen, str(out), socket.gethostname()))
    for rank, (theirs, their_out, host) in enumerate(others, start=1):
        if theirs != first[0]:
            raise ValueError(
                f"{_where(rank, host)} does not see the run folder rank 0 (host "
                f"{first[2]}) writes: its --out {their_out} is another folder than rank "
                f"0's {first[1]} (checkpoints would be saved in parts); give every node "
                "the same --out on a filesystem they share"
            )
