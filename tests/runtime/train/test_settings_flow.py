"""The settings' path from ``train_rank`` through the calls that pass them on is short.

A tiny one-process run is traced (``sys.setprofile``): every call into a module of the
package from another module (or from outside) that passes the whole settings or one of
its sections, as any argument (``self`` included), counts as one entry into the callee's
module (a section's own ``__repr__``, ``__eq__``... do not: nothing is passed on). No
module is entered more than :data:`MOST_ENTRIES` times, and the whole
settings object goes only to the top of the run (``train_rank`` -> ``Trainer`` ->
``assemble_run``) and to its own methods (``to_json``, ``save``, ``to_toml``); every
other call receives sections.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
from run_config import small_config

import datacentric
from datacentric.settings import TrainConfig
from datacentric.settings.layout import SECTIONS
from datacentric.train.trainer import train_rank

pytestmark = pytest.mark.usefixtures("one_thread")

PACKAGE = Path(datacentric.__file__).parent
#: The most entries into one module along the settings' path (was 13 for train/build.py).
MOST_ENTRIES = 4
#: Who may receive the whole settings: the top of a run and the settings' own methods.
WHOLE_TAKERS = {
    "train/trainer.py:train_rank",
    "train/assemble.py:assemble_run",
    "settings/run_settings.py:to_json",
    "settings/run_settings.py:save",
    "settings/run_settings.py:to_toml",
}


PREFIX = f"{PACKAGE}/"


def _module_of(frame) -> str | None:
    """The package module ``frame`` runs in, relative to the package; a dataclass's
    generated method is its class's module's."""
    path = frame.f_code.co_filename
    if path == "<string>" and "self" in frame.f_locals:
        module = sys.modules.get(type(frame.f_locals["self"]).__module__)
        path = getattr(module, "__file__", None) or path
    return path[len(PREFIX) :] if path.startswith(PREFIX) else None


def trace_settings(run) -> list[tuple[str, str, list[str], bool]]:
    """``(callee module, function, parameters given settings, whole)`` of every entry
    into a module that passes the settings on, while ``run()`` runs."""
    kinds = (TrainConfig, *SECTIONS.values())
    entries = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith((PREFIX, "<string>")):
            return  # not ours (the quick test first: every call of the run comes here)
        callee = _module_of(frame)
        if callee is None or frame.f_back is None or _module_of(frame.f_back) == callee:
            return
        name = code.co_name
        if name.startswith("__") and name.endswith("__") and name != "__init__":
            return  # repr, eq, hash of a section: read, not passed on
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        given = [n for n in names if isinstance(frame.f_locals.get(n), kinds)]
        if given:
            whole = any(isinstance(frame.f_locals.get(n), TrainConfig) for n in given)
            entries.append((callee, code.co_name, given, whole))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entries


def traced_run(out: str) -> None:
    """Trace a one-iteration run into ``out`` and print its entries as JSON (run in a
    fresh interpreter by the test below)."""
    config = small_config(Path(out), iterations=1, plots=False, tensorboard=False)
    print(json.dumps(trace_settings(lambda: train_rank(config))))


def test_the_settings_enter_each_module_at_most_four_times(tmp_path):
    # A fresh interpreter: what earlier tests left in this process (compiled graphs,
    # threads, patched modules) made the traced run crawl past its timeout here.
    entries = _in_a_fresh_interpreter("traced_run", tmp_path / "run")
    path = "\n".join(f"{m}:{f}({', '.join(given)})" for m, f, given, _ in entries)
    counts = Counter(module for module, *_ in entries)
    assert counts["train/assemble.py"] == 1 and counts["train/build.py"] >= 1, path
    assert max(counts.values()) <= MOST_ENTRIES, f"{counts.most_common(3)}:\n{path}"
    whole = {f"{m}:{f}" for m, f, _, takes_whole in entries if takes_whole}
    assert whole <= WHOLE_TAKERS, f"the whole settings went to {whole - WHOLE_TAKERS}"


def planted_path(out: str) -> None:
    """A planted path traced into JSON: a helper handing the settings five times into
    one module, then the whole settings where a section belongs."""
    from datacentric.train import build

    config = small_config(Path(out))

    def five_times():
        for _ in range(5):
            build.sharding(config.parallelism)
        with warnings.catch_warnings():  # reads a flat key off the whole settings
            warnings.simplefilter("ignore", DeprecationWarning)
            build.model_args(config)  # the whole settings where a section belongs

    print(json.dumps(trace_settings(five_times)))


def _in_a_fresh_interpreter(function: str, out: Path) -> list:
    here = Path(__file__).resolve()
    paths = [str(here.parent), str(here.parents[2])]  # this module, tests/ (run_config)
    code = (
        f"import sys; sys.path[:0] = {paths!r}; import test_settings_flow as t; "
        f"t.{function}({str(out)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_trace_counts_a_module_entered_too_often(tmp_path):
    entries = _in_a_fresh_interpreter("planted_path", tmp_path / "run")
    counts = Counter(module for module, *_ in entries)
    assert counts["train/build.py"] == 6 > MOST_ENTRIES
    assert ["train/build.py", "model_args", ["model"], True] in entries
