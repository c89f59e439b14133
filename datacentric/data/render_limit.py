"""A time and size limit on rendering one conversation with a chat template.

A chat template is a program (Jinja, run in transformers' sandbox): the sandbox keeps it
from reaching files or code, not from looping. A template that loops ``10**10`` times
would hold ``train`` until killed. :class:`RenderDeadline` stops a render that runs
longer than its limit: a watchdog thread raises :class:`RenderTimeout` in the rendering
thread (``PyThreadState_SetAsyncExc``, delivered at the template's next Python
instruction: Jinja compiles templates to Python), and the caller refuses the record naming
its file and line; so is a rendering of more than :data:`RENDER_MAX_TOKENS` tokens.
Neither signals nor the main thread are needed, so the limit holds in any thread and
leaves the run's signal handlers alone.

The limit grows with the record: rendering includes tokenizing, whose time is the text's
length, so a record gets :data:`RENDER_LIMIT_S` plus :data:`RENDER_S_PER_MIB` per MiB of
its text (:func:`render_limit_s`); only a template that loops is stopped as one. A record
of more than :data:`RENDER_MAX_CHARS` characters is refused as too long before it
renders, naming its length.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from datacentric.data.base import DataError
from datacentric.data.documents import Record

if TYPE_CHECKING:
    from datacentric.data.chat import ChatRenderer

#: Seconds one conversation may take to render, plus :data:`RENDER_S_PER_MIB` per MiB of
#: its text (a real one of a few KiB takes milliseconds).
RENDER_LIMIT_S = 10.0
#: Seconds added per MiB (2**20 characters) of a record's text: tokenizing runs at MB/s
#: (a test tokenizer: about 1 MiB/s on a loaded 2-core machine), so this leaves a 10x
#: margin; a 10 MB record may render for 10 + 95 s.
RENDER_S_PER_MIB = 10.0
#: Characters of text one record may hold (64 Mi, about 16 Mi tokens: the size of
#: :data:`RENDER_MAX_TOKENS`); a longer one is refused as too long before it renders.
RENDER_MAX_CHARS = 1 << 26
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
    def each(self, limit_s: float | None = None) -> Iterator[None]:
        """Run the body under the limit (``limit_s``, else the deadline's):
        :class:`RenderTimeout` when it runs past it."""
        with self._lock:
            self._target = threading.get_ident()
            self._until = time.monotonic() + (self.limit_s if limit_s is None else limit_s)
            self._fired = False
        try:
            yield
        finally:
            with self._lock:
                self._until = None
                if self._fired:  # fired as the body ended: cancel what is not delivered
                    _raise_in(self._target, None)


def text_chars(value: Any) -> int:
    """Characters of text in a record's fields (strings, also inside lists and mappings;
    keys included)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(k) + text_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(text_chars(v) for v in value)
    return 0


def render_limit_s(base_s: float, chars: int) -> float:
    """Seconds a record of ``chars`` characters may take to render: ``base_s`` plus
    :data:`RENDER_S_PER_MIB` per MiB (tokenizing time grows with the text)."""
    return base_s + RENDER_S_PER_MIB * chars / (1 << 20)


def render_within(
    deadline: RenderDeadline, renderer: ChatRenderer, record: Record, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """``renderer.render(record, dtype)`` under ``deadline``'s limit grown with the
    record's size (:func:`render_limit_s`); a render past it, or a record over
    :data:`RENDER_MAX_CHARS`, is a :class:`DataError` naming the record's file and line."""
    chars = text_chars(record.fields)
    if chars > RENDER_MAX_CHARS:
        raise DataError(
            f"{record.where}: the conversation holds {chars} characters of text, over the "
            f"limit of {RENDER_MAX_CHARS} per record (about {RENDER_MAX_TOKENS} tokens, far "
            "above any context window); split it, or leave the record out"
        )
    limit_s = render_limit_s(deadline.limit_s, chars)
    try:
        with deadline.each(limit_s):
            ids, mask = renderer.render(record, dtype)
    except RenderTimeout:
        raise DataError(
            f"{record.where}: rendering the conversation ({chars} characters) with the chat "
            f"template was stopped after {limit_s:.3g} s (one of this size takes well under "
            "that: does the template loop?); fix the template, or leave the record out"
        ) from None
    if len(ids) > RENDER_MAX_TOKENS:
        raise DataError(
            f"{record.where}: the chat template rendered the conversation to {len(ids)} "
            f"tokens, over the limit of {RENDER_MAX_TOKENS} per record; fix the template, or "
            "leave the record out"
        )
    return ids, mask
