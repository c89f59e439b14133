"""How a drop-in trainer stops a script: one line ``datacentric <command>: <message>`` on
stderr and exit status 2, never a traceback (:func:`stop`, :func:`ends_in_one_line`)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any


def stop(command: str, message: str) -> None:
    """Stop the script: one line ``datacentric <command>: <message>`` on stderr, exit
    status 2 (no traceback)."""
    if os.environ.get("RANK", "0") == "0":  # every rank stops; the first one says why
        print(f"datacentric {command}: {message}", file=sys.stderr)
    raise SystemExit(2)


def ends_in_one_line(what: str) -> Callable[[Callable], Callable]:
    """A user's call of a drop-in method (``what``: the call as the line names it, e.g.
    ``train()``) that ends in one line, never a traceback: a failure the library names
    (ValueError, OSError, RuntimeError, LookupError) as its message, any other as an
    internal error (``DATACENTRIC_DEBUG=1``: the traceback)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if os.environ.get("DATACENTRIC_DEBUG", "") not in ("", "0"):
                return method(self, *args, **kwargs)
            try:
                return method(self, *args, **kwargs)
            except (ValueError, OSError, RuntimeError, LookupError) as err:
                stop(self.command, f"{what}: {_first_line(err)}")
            except Exception as err:  # noqa: BLE001 - a user's call ends in one line
                stop(
                    self.command,
                    f"{what}: internal error {type(err).__name__}: {_first_line(err)} "
                    "(DATACENTRIC_DEBUG=1 shows the traceback)",
                )

        return call

    return wrap


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def refuse_given(command: str, given: dict[str, Any]) -> None:
    """Stop naming the constructor arguments given that the runtime cannot honour."""
    names = [name for name, value in given.items() if value is not None]
    if names:
        stop(
            command,
            f"{', '.join(names)}: not supported (the runtime packs, weights the loss and "
            "builds the optimizer itself); leave it unset",
        )
