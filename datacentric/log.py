"""The one logger of every message the package says (``datacentric``): notes, saves,
step lines, warnings about a run. The trainer and the commands set its level and rank
filter (``train/reporting/metric_sinks.setup_logging``); before that, :func:`get_logger` gives it a
handler that writes the message alone to stderr. :func:`quiet_third_party` keeps the
other libraries' progress bars and advice out of a command's output (``--verbose`` lets
them through); :func:`quiet_loading` does the same around one load in any process (a run
or ``prepare`` started from Python). No torch, nothing of ours."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LOGGER_NAME = "datacentric"

#: Set (to 1) by ``--verbose``: third-party output is left as the libraries print it.
VERBOSE_ENV = "DATACENTRIC_VERBOSE"

#: The switches, read from the environment (so the ranks a command starts inherit them),
#: that keep other libraries quiet; a value the user set wins.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' and the hub's bars ("Loading weights")
    "TRANSFORMERS_VERBOSITY": "error",  # transformers' advice and warnings
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "DIFFUSERS_VERBOSITY": "error",  # diffusers' advice and warnings
    "TQDM_DISABLE": "1",  # diffusers' loader bars (its own switch is read only at its import)
    "KINETO_LOG_LEVEL": "6",  # the torch profiler's USDT and STAGE lines (6: none)
}


def verbose() -> bool:
    """Whether ``--verbose`` (or ``DATACENTRIC_VERBOSE=1``) asked for third-party output."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_third_party() -> None:
    """Silence the progress bars and advice of transformers, diffusers, the Hugging Face
    hub and the torch profiler in this process and the ranks it starts (:data:`QUIET_ENV`),
    unless :func:`verbose`. Libraries imported already are told directly."""
    if verbose():
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for library in ("transformers", "diffusers"):
        logs = sys.modules.get(f"{library}.utils.logging")
        if logs is not None:
            logs.set_verbosity_error()
            logs.disable_progress_bar()


@contextmanager
def quiet_loading() -> Iterator[None]:
    """diffusers' and transformers' loader bars ("Loading pipeline components", "Loading
    weights") off while a model or pipeline loads, unless :func:`verbose`, restored
    after: in a process no command started (a run or ``prepare`` called from Python),
    :data:`QUIET_ENV` was never set, and each bar left a blank line per component on a
    terminal. A library not installed is left out (it loads nothing)."""
    if verbose():
        yield
        return
    libraries = [
        importlib.import_module(f"{name}.utils.logging")
        for name in ("diffusers", "transformers")
        if importlib.util.find_spec(name) is not None
    ]
    shown = [logs.is_progress_bar_enabled() for logs in libraries]
    for logs in libraries:
        logs.disable_progress_bar()
    try:
        yield
    finally:
        for logs, was in zip(libraries, shown, strict=True):
            if was:
                logs.enable_progress_bar()


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a redirected stream, a
    test's capture), not the stream of the moment the handler was made."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: ANN201 (logging's attribute)
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001 (StreamHandler.__init__ sets it)
        del value


def get_logger() -> logging.Logger:
    """The ``datacentric`` logger, with a stderr handler (message only, ``info`` and up)
    when nothing has configured it yet."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_datacentric", False) for h in logger.handlers):
        handler = StderrHandler()
        handler._datacentric = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger
