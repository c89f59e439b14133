"""A time and size limit on rendering one conversation with a chat template.

A chat template is a program (Jinja, run in transformers' sandbox): the sandbox keeps it
from reaching files or code, not from looping. A template that loops ``10**10`` times
would hold ``train`` until killed. :class:`RenderDeadline` stops a render that runs
longer than :data:`RENDER_LIMIT_S`: a watchdog thread raises :class:`RenderTimeout` in
the rendering thread (``PyThreadState_SetAsyncExc``, delivered at the template's next
Python instruction: Jinja compiles templates to Python), and the caller refuses the
record naming its file and line; so is a rendering of more than
:data:`RENDER_MAX_TOKENS` tokens. Neither signals nor the main thread are needed, so the
limit holds in any thread and leaves the run's signal handlers alone.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.documents import Record

#: Seconds one conversation may take to render (a real one takes milliseconds).
RENDER_LIMIT_S = 10.0
#: Tokens one conversation may render to (16 Mi: far above any context window; a template
#: that multiplies its output is refused before the cache stores it).
RENDER_MAX_TOKENS = 1 << 24
#: How often the watchdog looks at the clock (a render is stopped this late at most).
WATCH_PERIOD_S = 0.25


class RenderTimeout(BaseException):
    """Raised in the rendering thread when a render ran past its limit (a
    ``BaseException``: the template library's ``except Exception`` must not swallow it)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Make ``thread_id`` raise ``exc`` at its next Python instruction (None: cancel)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class RenderDeadline:
    """A watchdog for a sequence of renders (a context manager); :meth:`each` arms it
    for one render."""

    def __init__(self, limit_s: float | None = None) -> None:
        self.limit_s = RENDER_LIMIT_S if limit_s is None else float(limit_s)
        self._lock = threading.Lock()
        self._target: int | None = None
        self._until: float | None = None
        self._fired = False
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def __enter__(self) -> RenderDeadline:
        self._watchdog = threading.Thread(target=self._watch, name="render-deadline", daemon=True)
        self._watchdog.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join()

    def _watch(self) -> None:
        while not self._stop.wait(min(WATCH_PERIOD_S, self.limit_s)):
            with self._lock:
                late = self._until is not None and time.monotonic() > self._until
                if late and not self._fired and self._target is not None:
                    self._fired = True
                    _raise_in(self._target, RenderTimeout)

    @contextmanager
    def each(self) -> Iterator[None]:
        """Run the body under the limit: :class:`RenderTimeout` when it runs past it."""
        with self._lock:
            self._target = threading.get_ident()
            self._until = time.monotonic() + self.limit_s
            self._fired = False
        try:
            yield
        finally:
            with self._lock:
                self._until = None
                if self._fired:  # fired as the body ended: cancel what is not delivered
                    _raise_in(self._target, None)


def render_within(
    deadline: RenderDeadline, renderer: Any, record: Record, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """``renderer.render(record, dtype)`` under ``deadline``; a render past the limit is
    a :class:`DataError` naming the record's file and line."""
    try:
        with deadline.each():
            ids, mask = renderer.render(record, dtype)
    except RenderTimeout:
        raise DataError(
            f"{record.where}: rendering the conversation with the chat template was stopped "
            f"after {deadline.limit_s:g} s (a real one takes milliseconds: does the template "
            "loop?); fix the template, or leave the record out"
        ) from None
    if len(ids) > RENDER_MAX_TOKENS:
        raise DataError(
            f"{record.where}: the chat template rendered the conversation to {len(ids)} "
            f"tokens, over the limit of {RENDER_MAX_TOKENS} per record; fix the template, or "
            "leave the record out"
        )
    return ids, mask
