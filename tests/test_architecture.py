"""The layering of the package, read from the source: every import of every module,
at any depth (lazy imports and ``TYPE_CHECKING`` blocks included, since both still
tie one module to another), and every ``importlib.import_module(...)`` or
``__import__(...)`` call whose name is a literal string, and the module names of a
subpackage's lazy table of public names (``_LAZY``, read by
:func:`datacentric.lazy_exports.lazy_exports`).

Every module belongs to one layer (``LAYERS``, lowest first) and imports only its own
layer and lower ones. Some layers are held tighter still: the bottom imports only
itself; ``settings`` only the bottom; ``models`` only ``datacentric.batch``; ``data``
only the bottom and ``settings``; ``planning`` and ``scheduling`` no torch and nothing
above them. The tests at the end plant each kind of fault and check the checks see it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "datacentric"

#: the shared types at the bottom: they import nothing of ours but each other
BOTTOM = {"datacentric.batch", "datacentric.shapes", "datacentric.schedule", "datacentric.timing"}
BOTTOM |= {"datacentric.progress", "datacentric.log", "datacentric.regular_files"}
#: the root package and the helper that loads its (and every package's) names lazily
ROOT_LAYER = {"datacentric", "datacentric.lazy_exports"}
#: what the confined layers may import (module names or layers)
#: the shared batch types, and the one reader of a model folder's JSON files
MODELS_MAY_IMPORT = {"datacentric.batch", "datacentric.regular_files", "datacentric"}
DATA_MAY_IMPORT = {"bottom", "settings", "datacentric"}
#: what the pure layers (planning, scheduling) may never import
IMPURE = ("torch", "datacentric.parallel", "datacentric.models", "datacentric.data")
IMPURE += ("datacentric.train", "datacentric.profiling", "datacentric.sim")
IMPURE += ("datacentric.cli", "datacentric.verify")

#: Every layer, lowest first. A module may import its own layer and those of lower
#: ranks, never one of its rank or above (layers that share a rank are siblings that
#: do not know each other). ``bottom`` is ``BOTTOM``; ``datacentric`` is the root
#: package, whose public names load lazily by a table of module names (read by no
#: import), so it imports nothing of ours and every layer may read ``__version__``.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("datacentric",),
    ("bottom",),
    ("settings",),
    ("data", "models"),
    ("planning",),
    ("scheduling",),
    ("parallel",),
    ("prepare",),
    ("profiling",),
    ("sim",),
    ("verify",),
    ("train",),
    ("cli", "integrations"),
    ("__main__",),
)
RANK = {layer: rank for rank, layers in enumerate(LAYERS) for layer in layers}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _relative_base(package: str, level: int, module: str) -> str:
    anchor = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(anchor + ([module] if module else []))


def _called_import(node: ast.Call) -> str | None:
    """The literal module name an ``import_module``/``__import__`` call imports, or None."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if called not in {"import_module", "__import__"} or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _lazy_table(node: ast.AST) -> list[str]:
    """The module names of a ``_LAZY = {name: module}`` table, else ``[]``."""
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
        return []
    if not any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
        return []
    values = node.value.values
    return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]


def imports_in(source: str, name: str, modules: set[str], *, package: bool = False) -> set[str]:
    """Every module the source of module ``name`` imports; ``from pkg import mod``
    counts as ``pkg.mod`` when ``mod`` is one of ``modules``, else as ``pkg``."""
    here = name if package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _relative_base(here, node.level, base)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else base)
        elif name != "datacentric" and (table := _lazy_table(node)):
            out.update(table)
        elif isinstance(node, ast.Call) and (target := _called_import(node)):
            if target.startswith("."):
                level = len(target) - len(target.lstrip("."))
                target = _relative_base(here, level, target.lstrip("."))
            out.add(target)
    return out


def read_graph(root: Path) -> dict[str, set[str]]:
    """Module name -> the modules it imports, for every ``.py`` file under ``root``."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {
        name: imports_in(
            path.read_text(encoding="utf-8"), name, set(paths), package=path.name == "__init__.py"
        )
        for name, path in paths.items()
    }


GRAPH = read_graph(ROOT)
MODULES = set(GRAPH)


def ours(target: str) -> bool:
    return target == "datacentric" or target.startswith("datacentric.")


def under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def layer_of(name: str) -> str:
    """The layer of one of our modules: ``bottom``, ``datacentric`` (the root package)
    or the subpackage or top-level module it lives in."""
    if name in BOTTOM:
        return "bottom"
    if name in ROOT_LAYER:
        return "datacentric"
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def edges(graph: dict[str, set[str]], layer: str, *, torch: bool = False):
    """``(module, target)`` for every import of ours (and of torch, if asked) made by
    a module of ``layer``, outside that layer."""
    for name, targets in graph.items():
        if layer_of(name) != layer:
            continue
        for target in sorted(targets):
            if (torch and under(target, "torch")) or (ours(target) and layer_of(target) != layer):
                yield name, target


def pure_layer_faults(graph: dict[str, set[str]], layer: str) -> list[str]:
    return [
        f"{name} imports {target}"
        for name, target in edges(graph, layer, torch=True)
        if any(under(target, prefix) for prefix in IMPURE)
    ]


def confined_faults(graph: dict[str, set[str]], layer: str, allowed: set[str]) -> list[str]:
    """Imports by ``layer`` of any of our modules outside ``allowed`` (module names, or
    layer names such as ``bottom``), and of torch by the torch-free ``settings``."""
    return [
        f"{name} imports {target}"
        for name, target in edges(graph, layer, torch=layer == "settings")
        if not (target in allowed or layer_of(target) in allowed)
    ]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b`` for every import of ours into a layer of the same or a higher
    rank than the importer's own."""
    return sorted(
        f"{name} imports {target}"
        for layer in RANK
        for name, target in edges(graph, layer)
        if RANK.get(layer_of(target), len(LAYERS)) >= RANK[layer]
    )


def unmapped(graph: dict[str, set[str]]) -> list[str]:
    return sorted(name for name in graph if layer_of(name) not in RANK)


def layer_faults(graph: dict[str, set[str]]) -> list[str]:
    """Every layer violation of ``graph``, by every rule of this file."""
    faults = [f"{name} is in no layer" for name in unmapped(graph)]
    faults += upward_imports(graph)
    for layer in ("planning", "scheduling"):
        faults += pure_layer_faults(graph, layer)
    faults += confined_faults(graph, "bottom", set())
    faults += confined_faults(graph, "settings", {"bottom"})
    faults += confined_faults(graph, "models", MODELS_MAY_IMPORT)
    faults += confined_faults(graph, "data", DATA_MAY_IMPORT)
    return sorted(set(faults))


def test_graph_is_read() -> None:
    assert "datacentric.scheduling.epoch" in GRAPH
    assert any(under(t, "torch") for t in GRAPH["datacentric.parallel.runtime"])
    assert "datacentric.batch" in GRAPH["datacentric.models.llama"]
    assert "peft" in GRAPH["datacentric.models.lora"]  # importlib.import_module("peft")


def test_every_module_has_a_layer() -> None:
    assert not unmapped(GRAPH)


@pytest.mark.parametrize("layer", ["planning", "scheduling"])
def test_pure_layers_import_no_torch_and_no_upper_layer(layer: str) -> None:
    bad = pure_layer_faults(GRAPH, layer)
    assert not bad, "\n".join(bad)


def test_models_import_only_the_shared_batch_types() -> None:
    bad = confined_faults(GRAPH, "models", MODELS_MAY_IMPORT)
    assert not bad, "\n".join(bad)


def test_data_imports_only_the_bottom_and_the_settings() -> None:
    """Datasets read files and settings; they know no model, plan, schedule or rank."""
    bad = confined_faults(GRAPH, "data", DATA_MAY_IMPORT)
    assert not bad, "\n".join(bad)


def test_bottom_layer_imports_only_itself() -> None:
    bad = confined_faults(GRAPH, "bottom", set())
    assert not bad, "\n".join(bad)


def test_settings_schema_imports_only_itself_and_the_bottom() -> None:
    """The torch-free settings schema: ``--help`` and ``config --show`` read it alone."""
    bad = confined_faults(GRAPH, "settings", {"bottom"})
    assert not bad, "\n".join(bad)


def test_layers_import_only_downwards() -> None:
    bad = upward_imports(GRAPH)
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


@pytest.mark.parametrize("layer", ["planning", "scheduling", "settings"])
def test_pure_layers_reach_no_torch_through_our_modules(layer: str) -> None:
    bad = [
        " -> ".join(chain)
        for name in GRAPH
        if layer_of(name) == layer
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


# -- planted faults: each check must see each kind of fault --------------------------


def test_the_package_has_no_layer_faults() -> None:
    faults = layer_faults(GRAPH)
    assert not faults, "\n".join(faults)


def planted(name: str, source: str, graph: dict[str, set[str]] | None = None) -> dict:
    """The package's graph with one more module, ``name``, read from ``source``."""
    graph = dict(GRAPH if graph is None else graph)
    graph[name] = imports_in(source, name, set(graph) | {name})
    return graph


PLANTED = [
    # a module-level forbidden import: data -> cli, data -> parallel
    ("datacentric.data.planted", "from datacentric.cli import main\n", "datacentric.cli.main"),
    (
        "datacentric.data.planted",
        "import datacentric.parallel.runtime\n",
        "datacentric.parallel.runtime",
    ),
    # a lazy import inside a function
    (
        "datacentric.data.planted",
        "def f():\n    from ..train import trainer\n",
        "datacentric.train.trainer",
    ),
    # import_module and __import__ with literal names
    (
        "datacentric.scheduling.planted",
        "import importlib\nimportlib.import_module('datacentric.sim.engine')\n",
        "datacentric.sim.engine",
    ),
    ("datacentric.settings.planted", "__import__('torch')\n", "torch"),
    (
        "datacentric.models.planted",
        "from importlib import import_module as m\nimport_module('..data', 'x')\n",
        "datacentric.data",
    ),
    # a lazy table of public names that reaches up (data -> train)
    (
        "datacentric.data.planted",
        "_LAZY = {'Trainer': 'datacentric.train.trainer'}\n",
        "datacentric.train.trainer",
    ),
    # an upward import between middle layers
    (
        "datacentric.parallel.planted",
        "from datacentric.sim.engine import simulate\n",
        "datacentric.sim.engine",
    ),
    # a pure layer that reads a model
    (
        "datacentric.planning.planted",
        "from datacentric.models import llama\n",
        "datacentric.models.llama",
    ),
    # siblings: data and models share a rank and do not know each other
    (
        "datacentric.models.planted",
        "from datacentric.data.base import Dataset\n",
        "datacentric.data.base",
    ),
    # a layer nobody mapped
    ("datacentric.newlayer.planted", "", None),
]


@pytest.mark.parametrize(("name", "source", "target"), PLANTED)
def test_each_planted_fault_is_found(name: str, source: str, target: str | None) -> None:
    faults = layer_faults(planted(name, source))
    expected = f"{name} is in no layer" if target is None else f"{name} imports {target}"
    assert expected in faults
    assert all(fault.startswith(name) for fault in faults)


def test_the_layer_order_alone_finds_upward_and_sibling_imports() -> None:
    graph = {
        "datacentric.parallel.runtime": {"datacentric.sim.engine", "datacentric.batch"},
        "datacentric.data.text": {"datacentric.models.llama", "datacentric.settings"},
        "datacentric.sim.engine": {"datacentric.parallel.runtime", "datacentric"},
    }
    assert upward_imports(graph) == [
        "datacentric.data.text imports datacentric.models.llama",
        "datacentric.parallel.runtime imports datacentric.sim.engine",
    ]


def test_a_planted_import_module_cycle_is_found() -> None:
    """scheduling -> sim by ``import_module``, sim -> scheduling by a plain import."""
    graph = planted(
        "datacentric.scheduling.planted",
        "def load():\n    import importlib\n\n"
        "    return importlib.import_module('datacentric.sim.planted')\n",
    )
    graph = planted(
        "datacentric.sim.planted", "from datacentric.scheduling import planted\n", graph
    )
    assert ["datacentric.scheduling.planted", "datacentric.sim.planted"] in strongly_connected(
        graph
    )


def test_a_planted_file_is_read_from_disk(tmp_path: Path) -> None:
    """The whole reading path (files, packages, relative and lazy imports) on a small tree."""
    root = tmp_path / "datacentric"
    for path, text in {
        "__init__.py": "",
        "batch.py": "import torch\n",
        "cli/__init__.py": "",
        "cli/main.py": "from .. import batch\n",
        "data/__init__.py": "from . import text\n",
        "data/text.py": "from datacentric.batch import PackedBatch\n\n"
        "def f():\n    from ..cli.main import run\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    graph = read_graph(root)
    assert graph["datacentric.data"] == {"datacentric.data.text"}
    assert graph["datacentric.cli.main"] == {"datacentric.batch"}
    assert layer_faults(graph) == ["datacentric.data.text imports datacentric.cli.main"]


def test_conftest_imports_no_torch_at_module_level() -> None:
    """The tests of the torch-free layers must be able to run without torch loaded."""
    tree = ast.parse((Path(__file__).parent / "conftest.py").read_text(encoding="utf-8"))
    top = {"conftest"}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= imports_in(ast.unparse(node), "conftest", set())
    assert not [name for name in top if under(name, "torch")]


#: Deprecated locations -> where their names live now. Our own modules, tests, benchmarks
#: and examples import only the new places; each old one still imports, with a warning.
DEPRECATED_MODULES = {
    "datacentric.models.batch": "datacentric.batch",
    "datacentric.scheduling.options": "datacentric.settings",
    "datacentric.train.config": "datacentric.settings",
}
#: The files that import a deprecated location on purpose: to check it still works and warns.
CHECKS_DEPRECATIONS = {
    "tests/test_public_api.py",
    "tests/test_architecture.py",
    "tests/pure/settings/test_one_type_per_section.py",
    "tests/runtime/data/test_data_sources.py",
}
#: Deprecated names of a module that still exists -> their names now.
DEPRECATED_NAMES = {
    ("datacentric.settings", "ScheduleOptions"): "SchedulingConfig",
    ("datacentric.scheduling", "ScheduleOptions"): "datacentric.settings.SchedulingConfig",
    ("datacentric.data", "DataSettings"): "DataConfig",
    ("datacentric.data.sources", "DataSettings"): "datacentric.data.DataConfig",
    ("datacentric.models.configs", "ModelConfig"): "PresetConfig",
}
REPO = ROOT.parent


def _deprecated_names(source: str) -> list[str]:
    """``module.name`` of each :data:`DEPRECATED_NAMES` import in ``source``, and each
    read of a name deprecated wherever it is (``data.DataSettings``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if (node.module, alias.name) in DEPRECATED_NAMES
            ]
        elif isinstance(node, ast.Attribute) and node.attr in ("ScheduleOptions", "DataSettings"):
            found.append(f"{ast.unparse(node.value)}.{node.attr}")
    return found


def deprecated_imports(files: dict[str, str]) -> list[str]:
    """``file imports old`` for each import of a :data:`DEPRECATED_MODULES` location in
    ``files`` (repository path -> source), the deprecated modules themselves left out."""
    found = []
    for path, source in sorted(files.items()):
        name = module_name(REPO / path, REPO)
        if name in DEPRECATED_MODULES or path in CHECKS_DEPRECATIONS:
            continue
        package = path.endswith("__init__.py")
        for target in sorted(imports_in(source, name, MODULES, package=package)):
            if target in DEPRECATED_MODULES:
                found.append(f"{path} imports {target} (use {DEPRECATED_MODULES[target]})")
        found += [f"{path} reads the deprecated {old}" for old in _deprecated_names(source)]
    return found


def test_nothing_of_ours_imports_a_deprecated_location() -> None:
    files = {
        str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
        for folder in ("datacentric", "tests", "benchmarks", "examples")
        for p in sorted((REPO / folder).rglob("*.py"))
    }
    faults = deprecated_imports(files)
    assert not faults, "\n".join(faults)


@pytest.mark.parametrize(
    "source",
    [
        "from datacentric.train.config import TrainConfig\n",
        "def f():\n    from datacentric.scheduling import options\n",
        "import importlib\nimportlib.import_module('datacentric.models.batch')\n",
        "from datacentric.data import DataSettings\n",
        "from datacentric.settings import ScheduleOptions\n",
        "import datacentric.scheduling as s\nx = s.ScheduleOptions()\n",
    ],
)
def test_a_planted_import_of_a_deprecated_location_is_found(source: str) -> None:
    assert len(deprecated_imports({"tests/runtime/test_planted.py": source})) == 1
    assert deprecated_imports({"tests/test_public_api.py": source}) == []


@pytest.mark.parametrize("old", sorted(DEPRECATED_MODULES))
def test_each_deprecated_location_still_imports_and_warns(old: str) -> None:
    import importlib
    import sys
    import warnings

    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    sys.modules.pop(old, None)
    new = importlib.import_module(DEPRECATED_MODULES[old])
    shared = [n for n in getattr(new, "__all__", ()) if hasattr(module, n)]
    assert shared and all(getattr(module, n) is getattr(new, n) for n in shared)
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert messages and DEPRECATED_MODULES[old] in messages[0] and "0.3.0" in messages[0]


# -- commands: no module of cli/ imports another command's module ----------------------


def defines_register(source: str) -> bool:
    """Whether a module's source defines ``register`` at its top level: a command of
    ``cli/main.build_parser``."""
    tree = ast.parse(source)
    return any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body)


def command_modules(root: Path = ROOT) -> set[str]:
    """The modules of ``root``'s ``cli/`` that are commands."""
    return {
        module_name(path, root)
        for path in sorted((root / "cli").glob("*.py"))
        if defines_register(path.read_text(encoding="utf-8"))
    }


def command_import_faults(graph: dict[str, set[str]], commands: set[str]) -> list[str]:
    """``a imports command module b`` for every import by a module of ``cli/`` of a
    command's module other than its own: what commands share lives in a module no
    command owns."""
    return sorted(
        f"{name} imports command module {target}"
        for name, targets in graph.items()
        if under(name, "datacentric.cli")
        for target in targets
        if target in commands and target != name
    )


COMMANDS = command_modules()


def test_the_commands_are_found() -> None:
    assert {"datacentric.cli.train", "datacentric.cli.plan", "datacentric.cli.bench"} <= COMMANDS
    assert "datacentric.cli.flags" not in COMMANDS and "datacentric.cli.main" not in COMMANDS


def test_no_cli_module_imports_another_command_s_module() -> None:
    faults = command_import_faults(GRAPH, COMMANDS)
    assert not faults, "\n".join(faults)


@pytest.mark.parametrize(
    ("name", "source", "target"),
    [
        # a command importing another's helper, at module level and lazily
        ("datacentric.cli.simulate", "from datacentric.cli.schedule import run\n", "schedule"),
        ("datacentric.cli.demo", "def f():\n    from .bench import run\n", "bench"),
        ("datacentric.cli.profile", "from datacentric.cli import plan\n", "plan"),
        (
            "datacentric.cli.bench",
            "import importlib\nimportlib.import_module('datacentric.cli.train')\n",
            "train",
        ),
        # a shared module importing a command
        ("datacentric.cli.planning_inputs", "import datacentric.cli.plan as p\n", "plan"),
    ],
)
def test_a_planted_import_of_a_command_module_is_found(name: str, source: str, target: str) -> None:
    faults = command_import_faults(planted(name, source), COMMANDS)
    ours = [fault for fault in faults if fault.startswith(name + " ")]
    assert ours == [f"{name} imports command module datacentric.cli.{target}"]


def test_a_planted_command_import_is_read_from_disk(tmp_path: Path) -> None:
    """Commands found by their ``register``, imports read from the files."""
    root = tmp_path / "datacentric"
    for path, text in {
        "__init__.py": "",
        "cli/__init__.py": "",
        "cli/shared.py": "def helper():\n    pass\n",
        "cli/one.py": "from .shared import helper\n\ndef register(s):\n    pass\n",
        "cli/two.py": "from datacentric.cli.one import register as one\n\n"
        "def register(s):\n    one(s)\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    commands = command_modules(root)
    assert commands == {"datacentric.cli.one", "datacentric.cli.two"}
    assert command_import_faults(read_graph(root), commands) == [
        "datacentric.cli.two imports command module datacentric.cli.one"
    ]
