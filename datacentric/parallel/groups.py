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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from datacentric.schedule import Assignment, aligned_groups, group_sizes


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


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device``: a CUDA device's, else this machine's physical memory
    (None when the system does not say). The budget's default share is taken of it
    (:func:`~datacentric.planning.memory_cap.resolve_memory_cap`), and the step lines
    give peak memory as a share of it."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


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
                "(init_process_group, launch.spawn or launch.init_from_env); "
                "use ProcessGroups.local() for one process"
            )
        self.rank: int = dist.get_rank()
        self.world_size: int = dist.get_world_size()
        self.backend: str = str(dist.get_backend())
        self.device: torch.device = device_for_backend(self.backend, self.rank)
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
