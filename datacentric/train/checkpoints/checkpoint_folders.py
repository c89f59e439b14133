"""Where a run's checkpoints lie: the ``checkpoints/`` folder, its ``step-N`` (and
``step-N-rK``) checkpoints and the ``step-N.tmp`` saves not finished, the files each holds
(:data:`MANIFEST`, :data:`TRAINER_FILE`; :data:`REFUSED_FILE` where its steps ran on a
refused schedule) and :class:`CheckpointError`; a folder that is a link, and a name that
leads out of its folder, are not the run's own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


TRAINER_FILE = "trainer.json"


REFUSED_FILE = "schedule-refused.json"
"""Written (not in the manifest) into a checkpoint saved after steps that ran on a
resumed epoch's rebuilt schedule before it was found to differ from the saved one:
``--resume`` passes over such a checkpoint (deleting the file lets it be used)."""


#: Why a checkpoint holding :data:`REFUSED_FILE` is not resumed from unless named.
REFUSED_REASON = "saved after steps that ran on a schedule found to differ from the saved one"


def is_refused(path: str | Path) -> bool:
    """The checkpoint holds :data:`REFUSED_FILE`: its steps ran on a refused schedule."""
    return (Path(path) / REFUSED_FILE).is_file()


def named_checkpoints(names: list[str]) -> str:
    """``step-00000003``, or ``step-00000003 to step-00000005 (3 checkpoints)``: the
    checkpoints ``names`` (oldest first), said in one line."""
    return names[0] if len(names) == 1 else f"{names[0]} to {names[-1]} ({len(names)} checkpoints)"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, of another model, or cannot be written."""


_STEP_DIR = re.compile(r"^step-(\d+)(?:-r(\d+))?$")


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint folder name (``step-N`` or ``step-N-rK``), else None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


_UNFINISHED_DIR = re.compile(r"^step-(\d+)\.tmp$")


def unfinished_saves(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the run's ``step-N.tmp`` folders, oldest first: saves that
    were cut short (killed, or stopped by a full disk) or are still being written."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(_UNFINISHED_DIR.match(p.name), p) for p in root.iterdir() if _is_own_dir(p)]
    return sorted((int(m.group(1)), p) for m, p in found if m)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders (complete or not, no ``.tmp``), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    # a linked folder is not one of ours: its files lie outside the run
    found = [(_STEP_DIR.match(p.name), p) for p in root.iterdir() if _is_own_dir(p)]
    ordered = sorted((int(m.group(1)), int(m.group(2) or 0), p) for m, p in found if m)
    return [p for _, _, p in ordered]


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _is_own_dir(path: Path) -> bool:
    """A real folder (not a symbolic link to one)."""
    return path.is_dir() and not path.is_symlink()


def _inside(path: Path, folder: Path) -> bool:
    """``path``, its links followed, lies inside ``folder`` (also followed)."""
    return path.resolve().is_relative_to(folder.resolve())


def _plain_name(name: Any) -> bool:
    """A file name of its folder: no separator, not ``.`` or ``..``, not absolute."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
