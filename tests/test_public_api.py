"""The public surface (docs/api.md) against its checked-in snapshot, tests/public_api.txt.

The surface is every name in ``__all__`` of the packages :data:`PUBLIC_MODULES` lists,
with its call signature, and for a class the signatures of the methods and properties
our code defines on it. Removing a name or changing a signature fails
:func:`test_public_surface_matches_the_snapshot` until the snapshot, CHANGELOG.md and (for
a removal or a move) a deprecated alias are updated together.

Regenerate the snapshot after an intended change (it refuses while a removed or changed
name is missing from the top section of CHANGELOG.md)::

    .venv/bin/python tests/test_public_api.py --update
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).with_name("public_api.txt")
API_DOC = ROOT / "docs" / "api.md"
CHANGELOG = ROOT / "CHANGELOG.md"

PUBLIC_MODULES = (
    "datacentric",
    "datacentric.models",
    "datacentric.data",
    "datacentric.schedule",
    "datacentric.batch",
)
DEPRECATED_MODULES = {"datacentric.models.batch": "datacentric.batch"}
"""Old module -> its new place: importing the old one warns and names the new one."""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Shown:
    """A default or annotation shown as fixed text (no memory addresses)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(value: object) -> _Shown:
    if isinstance(value, str):
        return _Shown(value)  # postponed (``from __future__ import annotations``)
    return _Shown(inspect.formatannotation(value))


def _default(value: object) -> _Shown:
    if inspect.isfunction(value) or inspect.isclass(value):
        return _Shown(f"{value.__module__}.{value.__qualname__}")
    return _Shown(_ADDRESS.sub("", repr(value)))


def signature(obj: object) -> str:
    """``obj``'s call signature as stable text (annotations and defaults without
    addresses); ``(...)`` where Python cannot read one."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    empty = inspect.Parameter.empty
    params = [
        p.replace(
            annotation=empty if p.annotation is empty else _annotation(p.annotation),
            default=empty if p.default is empty else _default(p.default),
        )
        for p in sig.parameters.values()
    ]
    returns = sig.return_annotation
    return str(
        sig.replace(
            parameters=params,
            return_annotation=empty if returns is empty else _annotation(returns),
        )
    )


def _class_members(cls: type) -> dict[str, str]:
    """Public methods and properties our code defines on ``cls`` or its bases."""
    members: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("datacentric"):
            continue
        fields = getattr(klass, "__dataclass_fields__", {})
        for name, value in vars(klass).items():
            if name.startswith("_") or name in fields:
                continue
            if isinstance(value, property):
                members[name] = "property"
            elif isinstance(value, classmethod | staticmethod):
                members[name] = signature(getattr(cls, name))
            elif inspect.isfunction(value):
                members[name] = signature(value)
            else:
                members[name] = f": {type(value).__name__}"
    return members


def public_surface() -> dict[str, str]:
    """Every public name -> its description (one snapshot line each)."""
    surface: dict[str, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            key = f"{module_name}.{name}"
            if inspect.isclass(obj):
                surface[key] = f"class{signature(obj)}"
                for member, text in _class_members(obj).items():
                    surface[f"{key}.{member}"] = text
            elif callable(obj):
                surface[key] = signature(obj)
            else:
                surface[key] = f": {type(obj).__name__}"
    for old, new in DEPRECATED_MODULES.items():
        surface[old] = f"deprecated module -> {new}"
    return surface


def render(surface: dict[str, str]) -> str:
    return "".join(f"{key} {text}\n" for key, text in sorted(surface.items()))


def parse(text: str) -> dict[str, str]:
    entries = (line.split(" ", 1) for line in text.splitlines() if line.strip())
    return {key: rest for key, rest in entries}


def differences(snapshot: dict[str, str], live: dict[str, str]) -> dict[str, list[str]]:
    """Names ``removed`` from, ``changed`` in and ``added`` to ``live`` against
    ``snapshot``."""
    return {
        "removed": sorted(set(snapshot) - set(live)),
        "changed": sorted(k for k in set(snapshot) & set(live) if snapshot[k] != live[k]),
        "added": sorted(set(live) - set(snapshot)),
    }


def _public_name(key: str) -> str:
    """The module-level name an entry belongs to (``Llama.set_attention`` -> ``Llama``)."""
    for module_name in sorted(PUBLIC_MODULES, key=len, reverse=True):
        if key.startswith(module_name + "."):
            return key[len(module_name) + 1 :].split(".")[0]
    return key


def top_changelog_section() -> str:
    sections = re.split(r"^## ", CHANGELOG.read_text(), flags=re.M)
    return sections[1] if len(sections) > 1 else ""


def unannounced(diff: dict[str, list[str]], top: str) -> list[str]:
    """Removed or changed names that ``top`` (CHANGELOG.md's top section) does not
    mention."""
    names = {_public_name(k) for k in diff["removed"] + diff["changed"]}
    return sorted(n for n in names if n not in top)


def failure_message(diff: dict[str, list[str]]) -> str:
    lines = [f"{kind}: {', '.join(keys)}" for kind, keys in diff.items() if keys]
    return (
        "the public surface differs from tests/public_api.txt:\n"
        + "\n".join(lines)
        + "\nA removed, moved or changed public name needs, together: a deprecated alias "
        "that warns and names its replacement (for a removal or move), a line under the top "
        "version of CHANGELOG.md, its line in docs/api.md, and the snapshot regenerated "
        "with `.venv/bin/python tests/test_public_api.py --update`."
    )


def test_public_surface_matches_the_snapshot() -> None:
    diff = differences(parse(SNAPSHOT.read_text()), public_surface())
    assert not any(diff.values()), failure_message(diff)


def test_a_removed_or_changed_name_fails_against_a_modified_snapshot(tmp_path: Path) -> None:
    live = public_surface()
    lines = SNAPSHOT.read_text().splitlines()
    changed_key = "datacentric.models.build_model"
    modified = [
        f"{changed_key} (name: str, *, attention=None)"
        if line.startswith(changed_key + " ")
        else line
        for line in lines
    ]
    modified.append("datacentric.data.a_name_we_no_longer_ship (x: int) -> int")
    copy = tmp_path / "public_api.txt"
    copy.write_text("\n".join(modified) + "\n")
    diff = differences(parse(copy.read_text()), live)
    assert diff["changed"] == [changed_key]  # the live signature no longer matches
    assert diff["removed"] == ["datacentric.data.a_name_we_no_longer_ship"]
    message = failure_message(diff)
    assert "build_model" in message and "a_name_we_no_longer_ship" in message
    # The regeneration refuses until the changelog's top section names them.
    top = "0.9.0\n### Changed\n- `build_model` takes `attention=None`.\n"
    assert unannounced(diff, top) == ["a_name_we_no_longer_ship"]
    # And the unmodified snapshot matches.
    assert not any(differences(parse(SNAPSHOT.read_text()), live).values())


def test_docs_api_has_one_line_per_public_name() -> None:
    listed = re.findall(r"^- `(datacentric[\w.]*)`", API_DOC.read_text(), flags=re.M)
    names = {k for k in public_surface() if k.count(".") == _depth(k)}
    assert len(listed) == len(set(listed)), "docs/api.md lists a name twice"
    assert set(listed) == names, (
        f"docs/api.md is missing {sorted(names - set(listed))} and lists "
        f"{sorted(set(listed) - names)} that is not public"
    )


def _depth(key: str) -> int:
    """Dots in a module-level public name (its module's dots plus one)."""
    for module_name in sorted([*PUBLIC_MODULES, *DEPRECATED_MODULES], key=len, reverse=True):
        if key == module_name:
            return key.count(".")
        if key.startswith(module_name + "."):
            return module_name.count(".") + 1
    return -1


def test_every_public_name_is_exported_once_and_has_a_docstring() -> None:
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert len(module.__all__) == len(set(module.__all__)), module_name
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"


def test_the_moved_batch_module_warns_and_names_its_new_place() -> None:
    sys.modules.pop("datacentric.models.batch", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("datacentric.models.batch")
    from datacentric.batch import PackedBatch

    assert old.PackedBatch is PackedBatch
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert messages and "datacentric.batch" in messages[0]


def test_the_moved_batch_module_raises_under_w_error() -> None:
    """What ``python -W error::DeprecationWarning -c "import datacentric.models.batch"``
    does, in this process."""
    sys.modules.pop("datacentric.models.batch", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning, match=r"datacentric\.batch\b"):
            importlib.import_module("datacentric.models.batch")
    sys.modules.pop("datacentric.models.batch", None)


def test_version_is_the_changelog_top_and_the_command_prints_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import datacentric
    from datacentric.cli.main import main

    assert top_changelog_section().startswith(datacentric.__version__)
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"datacentric {datacentric.__version__}"


def test_the_fsdp2_default_is_announced_where_it_differs_from_0_1() -> None:
    from types import SimpleNamespace

    from datacentric.planning.sharding import ShardingSpec
    from datacentric.train.data_centric import announce_default_shard

    two_ranks = SimpleNamespace(world_size=2, distributed=True)
    with pytest.warns(UserWarning, match=r"full_tensor\(\)") as caught:
        announce_default_shard(ShardingSpec(), two_ranks)
    assert "shard='none'" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one rank, or another mode: as 0.1.0, no warning
        announce_default_shard(ShardingSpec(), SimpleNamespace(world_size=1, distributed=False))
        announce_default_shard(ShardingSpec("ddp"), two_ranks)
        # said by rank 0 only, not once per rank
        announce_default_shard(
            ShardingSpec(), SimpleNamespace(world_size=2, distributed=True, rank=1)
        )


def _update() -> int:
    """Rewrite the snapshot, once CHANGELOG.md names every removed or changed name."""
    live = public_surface()
    old = parse(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    missing = unannounced(differences(old, live), top_changelog_section()) if old else []
    if missing:
        print(
            "tests/public_api.txt not rewritten: add a line under the top version of "
            f"CHANGELOG.md for {', '.join(missing)} (and a deprecated alias for a removal)",
            file=sys.stderr,
        )
        return 2
    SNAPSHOT.write_text(render(live))
    print(f"wrote {len(live)} entries to tests/public_api.txt")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_public_api.py --update")
    sys.exit(_update())
