"""The one object that owns every process group of a run.

Data-centric parallelism switches the sequence-parallel (SP) group of a rank
from iteration to iteration. Creating communicators is slow and collective, so
:class:`ProcessGroups` creates, once at start and in the same order on every
rank, a group for every aligned contiguous block of ranks whose size divides
the world size (``datacentric.schedule.aligned_groups``). Switching SP size is
then a dictionary look-up.

Size-1 blocks get no communicator: :meth:`ProcessGroups.group` returns ``None``
for them and sequence-parallel attention falls back to plain attention. The
whole world is ``torch.distributed.group.WORLD``.

A hybrid group (:meth:`ProcessGroups.split`) of ``u x r`` ranks runs Ulysses over
``u`` adjacent ranks (an aligned block, so within a node when ``u`` is at most the GPUs
of one) and an attention ring over the ``r`` ranks holding the same Ulysses rank of
each block. The ring talks point to point on the world communicator, addressed by
global rank (:class:`RingGroup`), so it needs no communicator of its own.

The object is passed explicitly to whoever needs a group; there are no module
globals. The device a rank computes on is chosen here too (:func:`device_for_backend`
for a rank of a world, :func:`default_device` for one process alone), and its memory
read (:func:`device_memory_bytes`).

How a process gets its groups is here as well: :func:`process_groups` takes the world
already initialised (a spawned rank, or the caller's own ``init_process_group``),
joins torchrun's (:func:`init_from_env`, NCCL or gloo as :func:`backend_for` says), or
makes one local process's; the world's group is destroyed when the interpreter exits
(:func:`destroy_at_exit`). Starting the ranks themselves is
:mod:`datacentric.parallel.launch`'s.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from datacentric.schedule import Assignment, aligned_groups, group_sizes

#: the collective timeout (seconds) of a world initialised here or spawned
DEFAULT_TIMEOUT_S = 300.0


def device_for_backend(backend: str | None, rank: int = 0) -> torch.device:
    """The device a rank computes on: its CUDA device for NCCL, else the CPU.

    The CUDA device is ``LOCAL_RANK`` when set (torchrun), else ``rank`` modulo
    the number of visible devices.
    """
    if backend is not None and "nccl" in backend.lower():
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def default_device(device: str | torch.device | None = None) -> torch.device:
    """A single process's device: ``device`` if given, else ``cuda`` when available,
    else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def local_world_size(world_size: int) -> int:
    """How many ranks of a world of ``world_size`` run on this machine: torchrun's
    ``LOCAL_WORLD_SIZE`` under torchrun, else the whole world (a spawn starts every rank
    here; a world initialised by the caller without it is counted as one machine's)."""
    if under_torchrun() and "LOCAL_WORLD_SIZE" in os.environ:
        return max(1, int(os.environ["LOCAL_WORLD_SIZE"]))
    return max(1, world_size)


def device_memory_bytes(device: torch.device, world_size: int = 1) -> int | None:
    """The memory one rank of a world of ``world_size`` has on ``device``: a CUDA
    device's own, else this machine's physical memory shared evenly by the world's ranks
    on this machine (:func:`local_world_size`; None when the system does not say). Every
    rank computes the same, from fixed sizes (no free memory read). The budget's default
    share is taken of it (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`),
    and the step lines give peak memory as a share of it."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return physical // local_world_size(world_size)


def planning_memory_bytes(groups: ProcessGroups) -> int | None:
    """The device memory every rank of ``groups`` takes the default budget of: the least
    of the ranks' own (:func:`device_memory_bytes`; None when a rank's system does not
    say). Why the least: each rank plans the steps itself, so a budget read off each
    rank's own device (nodes with GPUs of other sizes, or other memory or ranks per node
    on CPUs) planned other steps on different ranks; the smallest device's holds on all.
    Collective on the world's group (every rank calls it); one process reads its own."""
    own = device_memory_bytes(groups.device, groups.world_size)
    if not (groups.distributed and groups.world_size > 1):
        return own
    least = torch.tensor([-1 if own is None else own], dtype=torch.int64, device=groups.device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=groups.world)
    return None if int(least.item()) < 0 else int(least.item())


@dataclass(frozen=True)
class RingGroup:
    """The global ranks of one attention ring, in ring order, and this rank's position."""

    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        """Positions in the ring."""
        return len(self.ranks)

    @property
    def next_rank(self) -> int:
        """The global rank this position sends key/value blocks to."""
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev_rank(self) -> int:
        """The global rank this position receives key/value blocks from."""
        return self.ranks[(self.index - 1) % self.size]


def split_position(rank_in_group: int, sp_size: int, ring_size: int) -> tuple[int, int]:
    """``(ring position, Ulysses rank)`` of a group rank in a ``u x r`` hybrid group
    (``u = sp_size / ring_size`` adjacent ranks per ring position)."""
    if ring_size < 1 or sp_size % ring_size:
        raise ValueError(f"ring size {ring_size} does not divide SP size {sp_size}")
    return divmod(rank_in_group, sp_size // ring_size)


class ProcessGroups:
    """Every aligned SP group of the world, created once, looked up by block.

    Construct it after ``torch.distributed.init_process_group`` on every rank
    (the constructor is collective), or with :meth:`local` for a single process
    without ``torch.distributed``.
    """

    def __init__(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ProcessGroups() needs torch.distributed initialised first "
                "(init_process_group, launch.spawn or groups.init_from_env); "
                "use ProcessGroups.local() for one process"
            )
        self.rank: int = dist.get_rank()
        self.world_size: int = dist.get_world_size()
        self.backend: str = str(dist.get_backend())
        self.device: torch.device = device_for_backend(self.backend, self.rank)
        #: this rank's node's ranks (:func:`local_world_size`): groups of more cross nodes
        self.ranks_per_node: int = local_world_size(self.world_size)
        self._groups: dict[tuple[int, int], dist.ProcessGroup | None] = {}
        # Every rank must call new_group for every group, in the same order.
        for start, size in aligned_groups(self.world_size):
            if size == 1:
                group = None
            elif size == self.world_size:
                group = dist.group.WORLD
            else:
                group = dist.new_group(ranks=list(range(start, start + size)))
            self._groups[(start, size)] = group

    @classmethod
    def local(cls, device: torch.device | str = "cpu") -> ProcessGroups:
        """A world of one rank without ``torch.distributed`` (profiling, tests)."""
        self = cls.__new__(cls)
        self.rank = 0
        self.world_size = 1
        self.backend = "none"
        self.device = torch.device(device)
        self.ranks_per_node = 1
        self._groups = {(0, 1): None}
        return self

    @property
    def distributed(self) -> bool:
        """Whether collectives run (False for :meth:`local`)."""
        return self.backend != "none"

    @property
    def sizes(self) -> tuple[int, ...]:
        """The SP group sizes available: every divisor of the world size."""
        return tuple(group_sizes(self.world_size))

    @property
    def world(self) -> dist.ProcessGroup | None:
        """The group of all ranks (``None`` for a local world)."""
        return dist.group.WORLD if self.distributed else None

    def group(self, rank_start: int, size: int) -> dist.ProcessGroup | None:
        """The group of ranks ``rank_start .. rank_start + size - 1`` (``None`` if size 1)."""
        try:
            return self._groups[(rank_start, size)]
        except KeyError:
            raise ValueError(
                f"no process group for ranks {rank_start}..{rank_start + size - 1}: at world "
                f"size {self.world_size} groups are aligned blocks of sizes {self.sizes} "
                "(rank_start a multiple of size)"
            ) from None

    def for_assignment(self, assignment: Assignment) -> dist.ProcessGroup | None:
        """The group an assignment runs on (``None`` for a group of one rank)."""
        return self.group(assignment.rank_start, assignment.sp_size)

    def split(
        self, rank_start: int, sp_size: int, ring_size: int = 1
    ) -> tuple[dist.ProcessGroup | None, RingGroup | None]:
        """This rank's Ulysses group and ring in the hybrid group of ``sp_size`` ranks at
        ``rank_start`` with ring degree ``ring_size`` (``None`` ring without one)."""
        position, ulysses_rank = split_position(self.rank - rank_start, sp_size, ring_size)
        ulysses = sp_size // ring_size
        group = self.group(rank_start + position * ulysses, ulysses)
        if ring_size == 1:
            return group, None
        ranks = tuple(rank_start + j * ulysses + ulysses_rank for j in range(ring_size))
        return group, RingGroup(ranks=ranks, index=position)

    def __repr__(self) -> str:
        return (
            f"ProcessGroups(rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend!r}, device={self.device}, sizes={self.sizes})"
        )


def agree_max(groups: ProcessGroups, *values: int) -> tuple[int, ...]:
    """Each of ``values`` as its largest over the ranks (collective: one small all-reduce
    for all of them; a single process returns them as they are)."""
    if not (groups.distributed and groups.world_size > 1):
        return values
    flags = torch.tensor(values, dtype=torch.int64, device=groups.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=groups.world)
    return tuple(int(v) for v in flags.tolist())


def under_torchrun() -> bool:
    """Whether this process runs under torchrun (its ``RANK`` and ``WORLD_SIZE`` are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(
    backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ProcessGroups:
    """Initialise ``torch.distributed`` from torchrun's environment and build the groups.

    ``backend`` defaults to NCCL when CUDA is available, else gloo. Reads
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (env:// init) and
    ``LOCAL_RANK`` for the CUDA device.
    """
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"init_from_env needs torchrun's environment; {', '.join(missing)} not set "
            "(start with `torchrun --nproc-per-node N ...` or use launch.spawn)"
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = device_for_backend(backend, int(os.environ["RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size,
            # torchrun's agent hosts the store when it says so; otherwise rank 0 does.
            is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0,
            timeout=timeout,
        )
        # A restarted worker group (torchrun --max-restarts) may meet the store of the
        # failed attempt: keys of each attempt get their own prefix, so no rank connects
        # to an address a dead rank published.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"datacentric/attempt-{attempt}", store)
        store.set(f"joined/{rank}", "1")  # read back only to name ranks that never came
        try:
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world_size, timeout=timeout
            )
        except dist.DistStoreError as err:  # 'wait timeout after 300000ms, keys: ...'
            line = _not_joined(store, world_size, timeout_s)
            if line is None:
                raise
            raise RuntimeError(line) from err
    destroy_at_exit()
    return ProcessGroups()


def _not_joined(store: dist.Store, world_size: int, timeout_s: float) -> str | None:
    """The line for a world that some ranks never joined within ``timeout_s``: which
    (each joining rank leaves a ``joined/RANK`` key in the store before it waits), and
    why that happens (their node stopped before it joined, most often on a refusal it
    said in its own log, or was never started); None when every rank came."""
    missing = [str(r) for r in range(world_size) if not store.check([f"joined/{r}"])]
    if not missing:
        return None
    if len(missing) == 1:
        ranks = f"rank {missing[0]}"
    else:
        shown = missing if len(missing) <= 8 else [*missing[:7], f"{len(missing) - 7} more"]
        ranks = f"ranks {', '.join(shown[:-1])} and {shown[-1]}"
    return (
        f"{ranks} of {world_size} did not join within {timeout_s:.0f} s "
        "(parallelism.collective_timeout_s): their node stopped before it joined (its log "
        "says why) or was not started; start every node with the same command"
    )


def backend_for(world_size: int, device: str | torch.device | None = None) -> str:
    """NCCL when every local rank gets its own GPU (and ``device`` is not the CPU),
    else gloo."""
    wants_cpu = device is not None and torch.device(device).type == "cpu"
    if not wants_cpu and torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def process_groups(
    timeout_s: float = DEFAULT_TIMEOUT_S, device: str | torch.device | None = None
) -> ProcessGroups:
    """This process's groups: the world already initialised (a spawned rank, or the
    caller's own ``init_process_group``), torchrun's world, or one local process on
    :func:`~datacentric.parallel.groups.default_device` (``device`` overriding)."""
    if dist.is_available() and dist.is_initialized():
        destroy_at_exit()
        return ProcessGroups()
    if under_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return init_from_env(backend_for(local, device), timeout_s=timeout_s)
    return ProcessGroups.local(default_device(device))


@functools.cache
def destroy_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, if it is still
    there then (registered once per process).

    A script that ends without ``destroy_process_group`` (a drop-in user's, or
    ``torchrun -m datacentric train``) leaves gloo's worker threads to the C++ teardown
    after Python's: a rank then dies with SIGABRT ("terminate called without an active
    exception") after its run succeeded. Run from ``atexit``, the group is destroyed
    while the interpreter still lives; a script that destroyed it itself is left alone.
    """
    import atexit

    atexit.register(_destroy_if_initialized)


def _destroy_if_initialized() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
