"""A spawned rank's failure reaches the launcher as :class:`RankFailure`: the text names
the rank and carries its traceback, as before, and it holds the exception the rank
raised and the ranks that failed alike, so the CLI says a refusal of bad input in the
line one process says (``on rank R of N`` after it where only some ranks refused) and a
crash as ``rank R failed: Type: ...``."""

from __future__ import annotations

import os
import signal

import pytest
import torch.distributed as dist

from datacentric.cli.main import one_line
from datacentric.parallel.launch import RankFailure, spawn

pytestmark = pytest.mark.usefixtures("one_thread")

REFUSAL = "data.dataset: sample 3 holds no token; remove it or pass --long-docs skip"


class TwoPartError(ValueError):
    """A refusal whose class does not unpickle from its message (it takes two parts)."""

    def __init__(self, setting: str, why: str) -> None:
        super().__init__(f"{setting}: {why}")


def _failing_on(ranks: tuple[int, ...], kind: str) -> int:
    """Raise ``kind`` on ``ranks``, return the rank elsewhere."""
    rank = dist.get_rank()
    if rank in ranks:
        if kind == "refusal":
            raise ValueError(REFUSAL)
        if kind == "two-part":
            raise TwoPartError("data.dataset", "sample 3 holds no token")
        if kind == "peer":
            raise dist.DistBackendError("Connection closed by peer [127.0.0.1]:29500")
        raise AttributeError("'NoneType' object has no attribute 'shape'")
    return rank


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "ranks", "where"),
    [(2, (1,), " (on rank 1 of 2)"), (2, (0, 1), ""), (4, (1, 3), " (on ranks 1 and 3 of 4)")],
)
def test_a_refusal_in_ranks_is_the_one_process_line(world, ranks, where):
    with pytest.raises(RankFailure) as failed:
        spawn(_failing_on, world, ranks, "refusal", timeout_s=120)
    failure = failed.value
    assert type(failure.error) is ValueError and str(failure.error) == REFUSAL
    assert failure.ranks == ranks and failure.world_size == world
    assert one_line(failure) == REFUSAL + where == one_line(ValueError(REFUSAL)) + where
    text = str(failure)  # as before: the rank, the type, the message, the traceback
    assert text.startswith(f"rank {failure.rank} failed: ValueError: {REFUSAL}\n")
    assert "Traceback (most recent call last)" in text and failure.rank in ranks


@pytest.mark.slow
def test_a_refusal_that_does_not_pickle_comes_back_as_its_built_in_class():
    with pytest.raises(RankFailure) as failed:
        spawn(_failing_on, 2, (0,), "two-part", timeout_s=120)
    assert type(failed.value.error) is ValueError
    assert one_line(failed.value) == "data.dataset: sample 3 holds no token (on rank 0 of 2)"


def _killed_beside_a_collective() -> int:
    """Rank 0 is killed (as the kernel's out-of-memory killer does); rank 1 then meets
    its closed connection in a collective."""
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return dist.get_rank()


@pytest.mark.slow
def test_a_rank_killed_is_the_failure_not_the_connection_its_peer_lost():
    """The rank that lost its peer reports a ``DistError``; the launcher names the rank
    that ended without a word, the cause, as it does when no peer reports first."""
    with pytest.raises(RuntimeError) as failed:
        spawn(_killed_beside_a_collective, 2, timeout_s=120)
    assert str(failed.value).startswith("rank 0 exited with code -9 without a result")
    assert one_line(failed.value).startswith("rank 0 exited with code -9")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("crash", "AttributeError: 'NoneType' object has no attribute 'shape'"),
        ("peer", "DistBackendError: Connection closed by peer [127.0.0.1]:29500"),
    ],
)
def test_a_crash_in_a_rank_keeps_its_rank_and_type(kind, line):
    """A crash, or a collective that failed with a peer (a rank that died first), is
    not a refusal: the rank and the type stay in front."""
    with pytest.raises(RankFailure) as failed:
        spawn(_failing_on, 2, (1,), kind, timeout_s=120)
    assert type(failed.value.error).__name__ == line.partition(":")[0]
    assert one_line(failed.value) == f"rank 1 failed: {line}"


def test_a_line_that_names_its_rank_gets_no_second_note():
    """The trainer's own failure of a step names its rank (``rank 1: iteration 3 failed
    in forward: ...``): the line is not followed by ``(on rank 1 of 2)`` as well; where
    another rank failed alike, or the line names none, the note is kept."""
    said = "rank 1: iteration 3 failed in forward: expected a 4-D input"
    alone = RankFailure(1, 2, f"RuntimeError: {said}", RuntimeError(said), (1,))
    assert one_line(alone) == said
    both = RankFailure(1, 4, f"RuntimeError: {said}", RuntimeError(said), (1, 3))
    assert one_line(both) == f"{said} (on ranks 1 and 3 of 4)"
    plain = RankFailure(1, 2, f"ValueError: {REFUSAL}", ValueError(REFUSAL), (1,))
    assert one_line(plain) == f"{REFUSAL} (on rank 1 of 2)"
