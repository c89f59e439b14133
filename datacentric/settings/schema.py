"""Machinery of the settings schema: field docs, type and range checks, TOML (no torch).

A *section* is a ``kw_only`` dataclass whose fields each carry a docstring (a string
literal right under the field, as in :class:`~datacentric.scheduling.options.
SchedulingConfig`) and optionally a range (``ge``/``gt`` in the field's metadata, see
:func:`setting`). The run's settings are one object of sections
(:class:`~datacentric.settings.run_settings.TrainConfig`: ``settings.training.lr``), as
files and flags are (``[training] lr``, ``--training.lr``). The docs are the only source
of help text, in every command.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from datacentric.settings.trainer_fields import other_names


class ConfigError(ValueError):
    """A setting is unknown, of the wrong type or out of range; the message names it."""


def setting(default: Any, *, ge: float | None = None, gt: float | None = None) -> Any:
    """A field with a default and an optional lower bound (``>= ge`` or ``> gt``)."""
    return dataclasses.field(default=default, metadata={"ge": ge, "gt": gt})


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: one-line doc}`` from the string literal under each field of ``cls``
    and of its dataclass bases (the first sentence-line, whitespace joined)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        own = set(klass.__dict__.get("__annotations__", {}))
        klass = klass.__dict__.get("__doc_source__", klass)
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
                and node.target.id in own
            ):
                docs[node.target.id] = plain_text(" ".join(after.value.value.split()))
    return docs


def plain_text(doc: str) -> str:
    """A docstring line as users read it in help and TOML comments: reST roles
    (``:func:`~a.b.c```) become their last name, double backquotes single ones."""
    doc = re.sub(r":\w+:`~?([\w.]+)`", lambda m: "`" + m.group(1).split(".")[-1] + "`", doc)
    return doc.replace("``", "`")


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of every field of ``cls`` (and its bases)."""
    return typing.get_type_hints(cls)


def choices_of(kind: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` (or ``Literal | None``) type."""
    for part in _parts(kind):
        if typing.get_origin(part) is Literal:
            return typing.get_args(part)
    return None


def _parts(kind: Any) -> tuple[Any, ...]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return typing.get_args(kind)
    return (kind,)


def type_name(kind: Any) -> str:
    """How the type reads in help and errors."""
    names = []
    for part in _parts(kind):
        if part is type(None) or part is Any:
            continue
        if typing.get_origin(part) is Literal:
            names.append(" | ".join(repr(v) for v in typing.get_args(part)))
        elif typing.get_origin(part) is tuple and typing.get_args(part)[-1] is Ellipsis:
            names.append(
                "list of integers" if typing.get_args(part)[0] is int else "list of strings"
            )
        elif typing.get_origin(part) is tuple:
            names.append("list of " + str(len(typing.get_args(part))) + " numbers")
        else:
            names.append(
                {int: "an integer", float: "a number", bool: "true or false"}.get(part, "a string")
            )
    return " or ".join(names)


_MISSING = object()


def coerce(key: str, value: Any, kind: Any, field: dataclasses.Field) -> Any:
    """``value`` checked against ``kind`` and the field's range; raises
    :class:`ConfigError` naming ``key``."""
    parts = _parts(kind)
    if value is None:
        if type(None) in parts:
            return None
        raise ConfigError(f"{key}: needs {type_name(kind)}, got nothing")
    result = _MISSING
    for part in parts:
        if part is not type(None):
            result = _coerce_one(value, part)
            if result is not _MISSING:
                break
    if result is _MISSING:
        raise ConfigError(f"{key}: needs {type_name(kind)}, got {value!r}")
    values = result if isinstance(result, tuple) else (result,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        raise ConfigError(f"{key}: needs a finite number, got {value!r}")
    if any(isinstance(v, int) and not -(2**63) <= v < 2**63 for v in values):
        raise ConfigError(
            f"{key}: {value!r} is outside the 64-bit integers a TOML file holds (-2**63 to "
            "2**63 - 1), so the run folder's config.toml could not record it; give a smaller one"
        )
    if any(isinstance(v, str) and not _is_utf8(v) for v in values):
        raise ConfigError(
            f"{key}: {value!r} holds bytes that are not UTF-8, which the run folder's "
            "config.toml and config.json cannot record; write it in UTF-8"
        )
    ge, gt = field.metadata.get("ge"), field.metadata.get("gt")
    if ge is not None and result < ge:
        raise ConfigError(f"{key}: must be >= {ge}, got {result!r}")
    if gt is not None and result <= gt:
        raise ConfigError(f"{key}: must be > {gt}, got {result!r}")
    return result


def _is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a command-line argument or file name of other
    bytes holds them as lone surrogates, which no file of settings can write)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _coerce_one(value: Any, kind: Any) -> Any:
    """``value`` as ``kind``, or ``_MISSING`` when it is not one (``Any``: an object given
    in Python, such as a dataset, kept as it is)."""
    if kind is Any:
        return value
    if typing.get_origin(kind) is Literal:
        return value if value in typing.get_args(kind) else _MISSING
    if kind is bool:
        return value if isinstance(value, bool) else _MISSING
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else _MISSING
    if kind is str:
        return value if isinstance(value, str) else _MISSING
    if typing.get_origin(kind) is tuple and typing.get_args(kind)[-1] is Ellipsis:
        if not isinstance(value, list | tuple):
            return _MISSING
        item = typing.get_args(kind)[0]
        items = [_coerce_one(v, item) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    if typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            return _MISSING
        items = [_coerce_one(v, a) for v, a in zip(value, args, strict=True)]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    return _MISSING


def our_key(name: str, valid: Iterable[str]) -> str | None:
    """The key of ``valid`` that another trainer's ``name`` means (Hugging Face
    ``Trainer``, TRL, torchtitan, Megatron-LM, torchrun: the one table of their names,
    :func:`~datacentric.settings.trainer_fields.other_names`; ``learning_rate`` in a TOML
    file, ``--learning-rate`` on the command line), spelled as ``valid`` spells its keys
    (``key``, or ``section_key`` where a section's flat keys carry its name); None when
    ``valid`` has none."""
    setting = other_names().get(name.lstrip("-").replace("-", "_"))
    if setting is None:
        return None
    section, key = setting.split(".")
    valid = set(valid)
    return next((k for k in (key, f"{section}_{key}") if k in valid), None)


def suggest(name: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name another trainer's ``name`` means
    (:func:`our_key`), else the closest valid name, else ``""``."""
    ours = our_key(name, valid)
    if ours is not None:
        return f" (did you mean {ours!r}?)"
    close = difflib.get_close_matches(name, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def plain_value(value: Any) -> Any:
    """A setting as JSON and TOML hold it: ``value``, or for an object given in Python (a
    dataset) its description, ``<ClassName object>``."""
    if value is None or isinstance(value, bool | int | float | str | list | tuple):
        return value
    return f"<{type(value).__name__} object>"


#: Characters a TOML basic string holds escaped (others below U+0020, and U+007F, as
#: ``\uXXXX``: a string read from a file, such as a multi-line ``bucket_config``, prints
#: back as TOML that reads)
_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _toml_char(char: str) -> str:
    """``char`` as a TOML basic string holds it (a control character escaped)."""
    return f"\\u{ord(char):04x}" if ord(char) < 0x20 or ord(char) == 0x7F else char


def toml_value(value: Any) -> str:
    """One value as TOML (strings, numbers, booleans and lists of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(c) or _toml_char(c) for c in value) + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
