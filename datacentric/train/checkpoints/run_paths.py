"""Where the paths a run recorded point: a run records its settings as they were typed
(``hf:my-model``, ``--tokenizer tok``), so a relative one is relative to the directory
the run was started in, not to where ``export`` runs now.

The directory is the checkpoint's record (``start_dir`` in ``trainer.json``); a run
recorded before it kept none, and its ``--out``, when typed relative, tells it: the run
folder's path now, less that ``--out``.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any


def start_dir(run: Path, trainer: dict[str, Any], settings: dict[str, Any]) -> Path | None:
    """The directory the run in ``run`` was started in (``trainer`` is its checkpoint's
    record, ``settings`` its settings by section); None where neither tells it."""
    recorded = trainer.get("start_dir")
    if isinstance(recorded, str) and os.path.isabs(recorded):
        return Path(recorded)
    typed = settings.get("job", {}).get("out")
    if not isinstance(typed, str) or not typed or os.path.isabs(os.path.expanduser(typed)):
        return None
    tail = Path(os.path.normpath(typed)).parts
    here = Path(os.path.abspath(run)).parts
    if ".." in tail or len(tail) >= len(here) or here[-len(tail) :] != tail:
        return None
    return Path(*here[: -len(tail)])


def places(typed: str, start: Path | None) -> list[Path]:
    """Where a path the run recorded as ``typed`` may be, in order: as the run saw it
    (relative to ``start``), then as typed here; one place for an absolute path, or a
    run started here."""
    path = Path(typed).expanduser()
    if path.is_absolute() or start is None or _same_dir(start, Path.cwd()):
        return [path]
    return [start / path, path]


def _same_dir(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except OSError:
        return False


def found_place(typed: str, start: Path | None) -> str | None:
    """Where the path ``typed`` (a glob pattern allowed) points from ``start`` (None: an
    absolute path only), symbolic links resolved; None where nothing is there (a name
    that is not a path, such as the tiny model ``hf:qwen2``, or a path since gone)."""
    path = Path(typed).expanduser()
    if not path.is_absolute():
        if start is None:
            return None
        path = start / path
    full = os.path.realpath(path)
    pattern = any(char in typed for char in "*?[")
    there = glob.glob(full) if pattern else os.path.exists(full)
    return full if there else None
