"""The one logger of every message the package says (``datacentric``): notes, saves,
step lines, warnings about a run. The trainer and the commands set its level and rank
filter (``train/metric_sinks.setup_logging``); before that, :func:`get_logger` gives it a
handler that writes the message alone to stderr. No torch, nothing of ours."""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "datacentric"


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
