"""The layering of the package, read from the source: every import of every module,
at any depth (lazy imports and ``TYPE_CHECKING`` blocks included, since both still
tie one module to another)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "datacentric"

#: the shared types at the bottom: they import nothing of ours but each other
BOTTOM = {"datacentric.batch", "datacentric.shapes", "datacentric.schedule", "datacentric.timing"}
#: what the pure layers (planning, scheduling) may never import
IMPURE = ("torch", "datacentric.parallel", "datacentric.models", "datacentric.data")
IMPURE += ("datacentric.train", "datacentric.profiling", "datacentric.sim")
IMPURE += ("datacentric.cli", "datacentric.verify")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """Every module ``name`` imports; ``from pkg import mod`` counts as ``pkg.mod``
    when ``mod`` is a module of ours, else as ``pkg``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def ours(target: str) -> bool:
    return target == "datacentric" or target.startswith("datacentric.")


def under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def test_graph_is_read() -> None:
    assert "datacentric.scheduling.epoch" in GRAPH
    assert any(under(t, "torch") for t in GRAPH["datacentric.parallel.runtime"])
    assert "datacentric.batch" in GRAPH["datacentric.models.llama"]


@pytest.mark.parametrize("layer", ["datacentric.planning", "datacentric.scheduling"])
def test_pure_layers_import_no_torch_and_no_upper_layer(layer: str) -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if under(name, layer)
        for target in targets
        if any(under(target, prefix) for prefix in IMPURE)
    )
    assert not bad, "\n".join(bad)


def test_models_import_only_the_shared_batch_types() -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if under(name, "datacentric.models")
        for target in targets
        if ours(target)
        and not under(target, "datacentric.models")
        and target != "datacentric.batch"
    )
    assert not bad, "\n".join(bad)


def test_bottom_layer_imports_only_itself() -> None:
    bad = sorted(
        f"{name} imports {target}"
        for name in BOTTOM
        for target in GRAPH[name]
        if ours(target) and target not in BOTTOM
    )
    assert not bad, "\n".join(bad)


def test_settings_schema_imports_only_itself_and_the_bottom() -> None:
    """The torch-free settings schema: ``--help`` and ``config --show`` read it alone."""
    bad = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if under(name, "datacentric.settings")
        for target in targets
        if under(target, "torch")
        or (ours(target) and target not in BOTTOM and not under(target, "datacentric.settings"))
    )
    assert not bad, "\n".join(bad)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, or a module
    that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["e"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = strongly_connected(GRAPH)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_no_test_fixtures_in_the_package() -> None:
    assert not [name for name in MODULES if name.rsplit(".", 1)[-1] in {"testing", "fixtures"}]


#: The middle layers, lowest first: a module may import its own layer and those below,
#: never one above (``parallel`` importing ``sim``, say).
MIDDLE = ("parallel", "profiling", "sim", "verify", "train", "cli")


def layer_of(name: str) -> int | None:
    for rank, layer in enumerate(MIDDLE):
        if under(name, f"datacentric.{layer}"):
            return rank
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b`` for every import from a middle layer into a higher one."""
    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in targets
        if layer_of(name) is not None
        and layer_of(target) is not None
        and layer_of(target) > layer_of(name)
    )


def test_middle_layers_import_only_downwards() -> None:
    bad = upward_imports(GRAPH)
    assert not bad, "\n".join(bad)


def test_the_layer_order_check_finds_an_upward_import() -> None:
    graph = {"datacentric.parallel.runtime": {"datacentric.sim.engine", "datacentric.batch"}}
    assert upward_imports(graph) == ["datacentric.parallel.runtime imports datacentric.sim.engine"]
    assert upward_imports({"datacentric.sim.engine": {"datacentric.parallel.runtime"}}) == []


def reaches_torch(graph: dict[str, set[str]], start: str) -> list[str]:
    """The chain of our modules by which ``start`` reaches an import of torch ([] if none)."""
    seen = {start}
    paths = [[start]]
    while paths:
        path = paths.pop()
        for target in sorted(graph.get(path[-1], ())):
            if under(target, "torch"):
                return [*path, target]
            if target in graph and target not in seen:
                seen.add(target)
                paths.append([*path, target])
    return []


@pytest.mark.parametrize(
    "layer", ["datacentric.planning", "datacentric.scheduling", "datacentric.settings"]
)
def test_pure_layers_reach_no_torch_through_our_modules(layer: str) -> None:
    bad = [
        " -> ".join(chain)
        for name in GRAPH
        if under(name, layer)
        for chain in [reaches_torch(GRAPH, name)]
        if chain
    ]
    assert not bad, "\n".join(bad)


def test_the_reach_check_follows_our_modules_to_torch() -> None:
    graph = {
        "datacentric.planning.x": {"datacentric.batch"},
        "datacentric.batch": {"torch"},
    }
    assert reaches_torch(graph, "datacentric.planning.x") == [
        "datacentric.planning.x",
        "datacentric.batch",
        "torch",
    ]
