"""Mutations of valid files and the rule every reader must keep on them.

A target (:class:`Target`) writes a valid file set into a folder and reads it back with
the package's own reader, in this process. :func:`fuzz` then writes mutants of one file
(seeded: example ``i`` of a kind is the same on every machine) and reads each again. A
read may end in one of two ways only:

- accepted: for a mutant that keeps the meaning (a BOM, CRLF line ends, JSON written
  another way, a symlink to the same bytes outside the folder), the value must equal the
  valid file's; for any other, it may be anything;
- refused: an error of a kind the command line reports as one line (``ValueError``,
  ``OSError``, ``RuntimeError``, ``LookupError``, not a bare ``KeyError``, ``IndexError``,
  ``RecursionError`` or decoding error), its first line naming the file.

Never a traceback type (``TypeError``, ``AttributeError``...), an ``internal error``, or
a read past :data:`BOUND_S` (a hang: a FIFO opened blocking, a loop).
``DATACENTRIC_FUZZ_EXAMPLES=N`` runs N mutants a kind instead of each target's default.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from time_limit import Blocked, within

from datacentric.cli.main import one_line

#: Seconds one read may take (a valid one takes milliseconds).
BOUND_S = 10.0
#: Seconds a read of a FIFO may take (a reader that opens it waits for a writer forever).
FIFO_BOUND_S = 2.0
#: What the command line reports as one line (:func:`datacentric.cli.main.one_line`).
USER_ERRORS = (ValueError, OSError, RuntimeError, LookupError)
#: Errors whose text names neither file nor cause: a reader must turn them into its own.
LEAKS = (KeyError, IndexError, RecursionError, UnicodeError, json.JSONDecodeError)
#: Line breaks other than LF that a text may hold (CR, VT, FF, FS, GS, RS, NEL, LS, PS).
ODD_BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
HUGE = [b"9" * 5000, b"1e999", b"-1e999", b"NaN", b"Infinity", b"-0", b"18446744073709551617"]


#: A read ran past :data:`BOUND_S`.
Hang = Blocked


@dataclass
class Target:
    """One file kind: ``seed(folder)`` writes a valid set and returns the file to mutate;
    ``read(path)`` reads it with the package's reader (``path``: what ``seed`` returned)
    and returns a comparable value. ``json``: the file is one JSON value (structural
    mutations apply); ``jsonl``: one a line. ``refit(path)``: make the rest of the set fit
    the mutant (a manifest's SHA-256). ``accepts_none``: the reader answers ``None`` for
    a file it does not take (no error)."""

    name: str
    seed: Callable[[Path], Path]
    read: Callable[[Path], Any]
    examples: int = 200
    json: bool = False
    jsonl: bool = False
    refit: Callable[[Path], None] | None = None
    accepts_none: bool = False
    text: bool = True
    """A text file: a BOM and CRLF line ends keep its meaning (in a binary one, not)."""
    crlf_same: bool = True
    """CRLF line ends keep its meaning (a text document, read byte for byte: not)."""
    expect: Any = None
    """What the valid seed must read as, where the value is known by hand (captions)."""
    names: Callable[[Path], list[str]] = field(default=lambda path: [path.name])


def examples(target: Target) -> int:
    """Mutants to try for ``target`` (``DATACENTRIC_FUZZ_EXAMPLES`` when set)."""
    return int(os.environ.get("DATACENTRIC_FUZZ_EXAMPLES") or target.examples)


@contextmanager
def bounded(seconds: float = BOUND_S, fifo: Path | None = None) -> Iterator[None]:
    """Raise :class:`Hang` in the body after ``seconds`` (main thread only). A read
    blocked on ``fifo`` in C code that holds the interpreter (a library's own ``open``,
    retried when the alarm interrupts it) is released by another process opening the
    FIFO's other end, again and again: the read then sees an empty file, and
    :class:`Hang` is raised all the same."""
    if fifo is None:
        with within(seconds):
            yield
        return
    loop = f"sleep {seconds}; while :; do : > '{fifo}'; sleep 0.1; done"
    writer = subprocess.Popen(["sh", "-c", loop], stderr=subprocess.DEVNULL)
    start = time.monotonic()
    try:
        with within(seconds):
            yield
    finally:
        writer.kill()
        writer.wait()
    if time.monotonic() - start >= seconds:  # it returned once the writer released it
        raise Hang(f"a read ran past {seconds:g} s")


# -- mutations: (name, bytes -> bytes, keeps the meaning) ------------------------------


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _flip(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _insert(rng: random.Random, data: bytes) -> bytes:
    junk = rng.choice(
        [b"\x00", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b",", b'"', b"\n", b"{", b"]", b"\\"]
        + [b.encode() for b in ODD_BREAKS]
    )
    at = rng.randrange(len(data) + 1)
    return data[:at] + junk * rng.randint(1, 3) + data[at:]


def _splice(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    return data[:a] + data[b:] if rng.random() < 0.5 else data[:b] + data[a:b] + data[b:]


def _huge_number(rng: random.Random, data: bytes) -> bytes:
    spots = [i for i, c in enumerate(data) if chr(c).isdigit()]
    if not spots:
        return data + rng.choice(HUGE)
    at = rng.choice(spots)
    end = at
    while end < len(data) and chr(data[end]).isdigit():
        end += 1
    return data[:at] + rng.choice(HUGE) + data[end:]


def _deep(rng: random.Random, data: bytes) -> bytes:
    depth = rng.choice([100, 5000, 100_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    at = rng.randrange(len(data) + 1)
    return data[:at] + opener * depth + closer * depth + data[at:]


def _odd_break(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", "replace")
    at = rng.randrange(len(text) + 1)
    return (text[:at] + rng.choice(ODD_BREAKS) + text[at:]).encode()


def _bom(rng: random.Random, data: bytes) -> bytes:
    return b"\xef\xbb\xbf" + data


def _crlf(rng: random.Random, data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def _trailing_newline(rng: random.Random, data: bytes) -> bytes:
    return data + b"\n" if not data.endswith(b"\n") else data + b"\n"


BYTE_MUTATIONS: list[tuple[str, Callable[[random.Random, bytes], bytes], bool]] = [
    ("truncate", _truncate, False),
    ("flip", _flip, False),
    ("insert", _insert, False),
    ("splice", _splice, False),
    ("huge number", _huge_number, False),
    ("deep nesting", _deep, False),
    ("odd line break", _odd_break, False),
    ("BOM", _bom, True),
    ("CRLF", _crlf, True),
]


def _odd_value(rng: random.Random, depth: int = 0) -> Any:
    choices: list[Any] = [None, True, 0, -1, 10**30, 1.5, float("inf"), "", "x" * 300]
    choices += ["\u2028", "a\x00b", [], {}, [1, "a"], {"k": None}]
    value = rng.choice(choices)
    if depth < 2 and rng.random() < 0.2:
        return [_odd_value(rng, depth + 1)] if rng.random() < 0.5 else {"n": _odd_value(rng)}
    return value


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _set(value[path[0]], path[1:], new)
    return copy


def _drop(value: Any, path: tuple) -> Any:
    parent = value
    for part in path[:-1]:
        parent = parent[part]
    if isinstance(parent, dict):
        return _set(value, path[:-1], {k: v for k, v in parent.items() if k != path[-1]})
    return _set(value, path[:-1], [v for i, v in enumerate(parent) if i != path[-1]])


def json_mutant(rng: random.Random, value: Any) -> tuple[str, Any, bool]:
    """A structural mutant of a JSON value: (what, value, keeps the meaning)."""
    paths = list(_paths(value))
    path = rng.choice(paths)
    roll = rng.random()
    if roll < 0.45:
        return f"{path} = odd value", _set(value, path, _odd_value(rng)), False
    if roll < 0.7 and path:
        return f"{path} dropped", _drop(value, path), False
    if roll < 0.8:
        return f"{path} in a list", _set(value, path, [_get(value, path)]), False
    if roll < 0.9 and isinstance(_get(value, path), dict):
        return f"{path} extra key", _set(value, path, {**_get(value, path), "x~": 1}), False
    return "written another way", value, True


def _get(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def _dump(value: Any, rng: random.Random) -> bytes:
    indent = rng.choice([None, 1, 4])
    return json.dumps(value, indent=indent, ensure_ascii=rng.random() < 0.5).encode()


def mutants(target: Target, valid: bytes, count: int) -> Iterator[tuple[str, bytes, bool]]:
    """``count`` seeded mutants of ``valid``: (what, bytes, keeps the meaning)."""
    for i in range(count):
        rng = random.Random(f"{target.name}:{i}")
        if (target.json or target.jsonl) and rng.random() < 0.5:
            if target.json:
                what, value, same = json_mutant(rng, json.loads(valid))
                yield f"json {what}", _dump(value, rng), same
                continue
            lines = valid.decode().splitlines()
            at = rng.randrange(len(lines))
            what, value, same = json_mutant(rng, json.loads(lines[at]))
            lines[at] = json.dumps(value, ensure_ascii=rng.random() < 0.5)
            yield f"line {at + 1} {what}", ("\n".join(lines) + "\n").encode(), same
            continue
        name, mutate, same = rng.choice(BYTE_MUTATIONS)
        keeps = same and target.text and (name != "CRLF" or target.crlf_same)
        yield name, mutate(rng, valid), keeps


# -- the rule ----------------------------------------------------------------------------


def refusal_problem(err: BaseException, names: list[str]) -> str | None:
    """What is wrong with ``err`` as a refusal (None: a clean one line naming a file)."""
    if isinstance(err, Hang):
        return "hang"
    if not isinstance(err, USER_ERRORS) or isinstance(err, LEAKS):
        return f"{type(err).__name__} leaked: {str(err)[:200]}"
    line = one_line(err)
    if "internal error" in line or "Traceback" in str(err):
        return f"not one line: {line[:200]}"
    if not any(name in line for name in names):
        return f"names no file ({', '.join(names)}): {line[:300]}"
    return None


def read_once(target: Target, path: Path) -> tuple[Any, BaseException | None]:
    """``target.read(path)`` under the bound: (value, None) or (None, the error)."""
    fifo = path if path.exists() and stat.S_ISFIFO(os.stat(path).st_mode) else None
    try:
        with bounded(FIFO_BOUND_S if fifo else BOUND_S, fifo):
            return target.read(path), None
    except (Exception, Hang) as err:  # noqa: BLE001 - judged by refusal_problem
        return None, err


def judge(target: Target, path: Path, what: str, same: bool, valid: Any) -> str | None:
    """Read ``path``; the problem found (None: accepted as the rule says, or refused)."""
    value, err = read_once(target, path)
    if err is not None:
        problem = refusal_problem(err, target.names(path))
        return None if problem is None else f"{target.name} {what}: {problem}"
    if target.accepts_none and value is None:
        return None
    if same and value != valid:
        return f"{target.name} {what}: accepted with another value: {str(value)[:300]}"
    return None


def special_files(target: Target, path: Path, valid: bytes) -> Iterator[tuple[str, bool]]:
    """Replace ``path`` by a FIFO, a folder, a symlink out of its folder (to the same
    bytes), nothing; yields (what, keeps the meaning) with ``path`` so replaced."""
    outside = path.parent.parent / f"outside-{target.name}"
    outside.mkdir(exist_ok=True)
    (outside / path.name).write_bytes(valid)
    for what in ("FIFO", "folder", "symlink out", "missing"):
        _remove(path)
        if what == "FIFO":
            os.mkfifo(path)
        elif what == "folder":
            path.mkdir()
            (path / "x.txt").write_text("x")
        elif what == "symlink out":
            path.symlink_to(outside / path.name)
        yield what, what == "symlink out"
    _remove(path)
    path.write_bytes(valid)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def fuzz(target: Target, folder: Path, count: int | None = None) -> list[str]:
    """Every problem ``count`` mutants and the special files of ``target`` show."""
    folder.mkdir(parents=True, exist_ok=True)
    path = target.seed(folder)
    value, err = read_once(target, path)
    assert err is None, f"{target.name}: the valid seed is refused: {err!r}"
    if target.expect is not None:
        assert value == target.expect, f"{target.name}: the valid seed reads {value!r}"
    valid = path.read_bytes()
    problems = []
    for what, data, same in mutants(target, valid, examples(target) if count is None else count):
        path.write_bytes(data)
        if target.refit is not None:
            target.refit(path)
        problem = judge(target, path, what, same, value)
        if problem:
            problems.append(problem)
    path.write_bytes(valid)
    if target.refit is not None:
        target.refit(path)
    for what, same in special_files(target, path, valid):
        problem = judge(target, path, what, same, value)
        if problem:
            problems.append(problem)
    return problems
