"""A spawned rank's failure reaches the launcher as :class:`RankFailure`: the text names
the rank and carries its traceback, as before, and it holds the exception the rank
raised and the ranks that failed alike, so the CLI says a refusal of bad input in the
line one process says (``on rank R of N`` after it where only some ranks refused) and a
crash as ``rank R failed: Type: ...``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

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


USER_ERRORS = """
import os

with open(MARKER, "a") as marker:  # who ran this file
    marker.write(f"{os.getpid()}\\n")


class MyError(Exception):
    pass


class MyRefusal(ValueError):
    pass


class MyWorded(ValueError):
    def __init__(self, said):
        super().__init__()  # no arguments: its __str__ words it
        self.said = said

    def __str__(self):
        return self.said
"""
SAID = "the user's own failure"


def _raising_from_file(path: str, name: str, kind: str) -> int:
    """Rank 1 loads the user's file (by its path, or by its module ``name`` where
    ``path`` is empty) and raises its ``kind``; rank 0 returns."""
    if dist.get_rank() == 1:
        if path:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(name)
        raise getattr(module, kind)(SAID)
    return dist.get_rank()


def _user_file(tmp_path: Path, name: str) -> Path:
    """The user's file ``name.py``, which notes each process that runs it in ``ran``."""
    path = tmp_path / f"{name}.py"
    path.write_text(USER_ERRORS.replace("MARKER", repr(str(tmp_path / "ran"))))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "builtin", "line"),
    [
        ("MyRefusal", ValueError, f"{SAID} (on rank 1 of 2)"),
        ("MyError", Exception, None),
        ("MyWorded", ValueError, f"{SAID} (on rank 1 of 2)"),
    ],
)
def test_a_class_of_a_file_loaded_by_its_path_comes_back_as_its_built_in_class(
    kind, builtin, line, tmp_path
):
    """The launcher cannot import the module of the rank's class (the rank loaded it
    from a file by its path): the failure carries its nearest built-in class with its
    message (it carried None, and a refusal read as a crash: 'rank 1 failed: MyRefusal:
    ...'); the text still names the rank and the real class; the file is not run here.
    A class whose ``__str__`` words its message keeps it (its ``args`` said nothing: the
    line was 'ValueError (on rank 1 of 2)')."""
    name = "user_errors_by_path"
    path = _user_file(tmp_path, name)
    with pytest.raises(RankFailure) as failed:
        spawn(_raising_from_file, 2, str(path), name, kind, timeout_s=120)
    failure = failed.value
    assert type(failure.error) is builtin and str(failure.error) == SAID
    assert str(failure).startswith(f"rank 1 failed: {kind}: {SAID}\n")
    assert one_line(failure) == (line or f"rank 1 failed: {kind}: {SAID}")
    assert name not in sys.modules
    ran = (tmp_path / "ran").read_text().split()
    assert len(ran) == 1 and ran != [str(os.getpid())]


@pytest.mark.slow
def test_a_class_of_a_module_importable_by_name_comes_back_as_itself(tmp_path, monkeypatch):
    """Only the rank imported it; the launcher imports it by its name to rebuild it."""
    name = "user_errors_by_name"
    _user_file(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(RankFailure) as failed:
        spawn(_raising_from_file, 2, "", name, "MyError", timeout_s=120)
    assert isinstance(failed.value.error, sys.modules[name].MyError)
    assert str(failed.value.error) == SAID


SCRIPT = """
import sys

import torch.distributed as dist

from datacentric.parallel.launch import RankFailure, launch


class MyError(Exception):
    pass


def work():
    if dist.get_rank() == 1:
        raise MyError("{said}")
    return dist.get_rank()


if __name__ == "__main__":
    try:
        launch(work, nproc=2)
    except RankFailure as failed:
        print(type(failed.error) is MyError, str(failed.error), str(failed).splitlines()[0])
"""


@pytest.mark.slow
def test_a_class_of_the_user_s_script_comes_back_as_itself(tmp_path):
    """A Python-API run at world 2 from a script whose ranks raise the script's own
    class: the failure carries an instance of that very class (the ranks' ``__mp_main__``
    is the script, the launcher's ``__main__``)."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(said=SAID)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.stdout.strip() == f"True {SAID} rank 1 failed: MyError: {SAID}", done.stderr
