"""The settings' static path from ``train/trainer.py:train_rank`` is short.

Read from the source alone (nothing runs): the walk enters ``train_rank`` holding its
``config`` parameter and follows every call of the package that is handed the settings
or a value derived from them, in every branch (an ``if`` not taken in a given run is
walked all the same). Inside a function a name is derived from the settings when it is
assigned (``=``, ``for``, ``with``, ``:=``, a comprehension) from an expression that
reads one already derived (``config.model``, ``spec = run_spec(model)``, ``self.model
= model``); a call passes them on when one of its arguments reads one, or when it calls
a method of an object a derived name holds (``scheduling.updated(...)``). The callee
is found by the names the module imports (lazy imports and the packages' lazy tables
included), a class (its ``__init__``), or a method of an object whose class the source
says: ``self``, an annotated parameter or dataclass field, ``x = Cls(...)``, an
attribute ``__init__`` sets from a class's call; a call the source does not resolve
(``obj.method()`` of an unknown class, a function passed as a value) is not followed.
An annotation with a ``typing.Protocol`` names an interface, not the object's class:
its methods are stubs that never run, so a call through it is not followed either.
Calls are taken in the order they run (a call's arguments before it), and each
function is walked once, where the path first reaches it.

The path is the functions in the order the walk enters them; consecutive functions of
one module make one stay there. The test reports three numbers:

- **stays**: the stays along the path;
- **climbs back up**: the stays in a module of a higher layer than the stay before it
  (the layer order of ``tests/test_architecture.py``, drawn in docs/architecture.md);
- **entries per module**: the most stays in any one module.

:data:`CEILINGS` holds today's numbers, so a change that lengthens the path fails
here; lower them as the path shortens. The target of the architecture's fifth round
is at most 60 stays, 8 climbs back up and 4 entries per module. (The runtime trace,
``tests/runtime/train/test_settings_flow.py``, follows one run's path instead.)
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from test_architecture import RANK, layer_of, module_name

ROOT = Path(__file__).resolve().parents[1] / "datacentric"
START = ("datacentric.train.trainer", "train_rank", "config")

#: today's path: stays, climbs back up, the most entries into one module (4: the
#: target's, in train.build); one stay more than 119 since a pretrained folder's
#: weights are checked against the model it loads into (models.model_args'
#: check_loaded_weights, which the hf: and diffusers: builders share); one more since
#: the ranks' plan is made in assemble_run, its refusal train's line (check_plan); two
#: more since the global-batch note and refusals say their counts with their units
#: (progress.counted, a stay there and one back in scheduling.global_batches); one
#: more and a climb since a record's field of another kind is named in JSON's words
#: through regular_files.json_kind, the one namer of the JSON readers; one more since
#: the ranks check they were given the same settings (train.rank_agreement); one more
#: since the runtime sets gradients held before an iteration aside (parallel.grad_sync);
#: one more and a climb since a profile records the ranks of one node, torchrun's
#: LOCAL_WORLD_SIZE; four fewer and a climb fewer since the step's SP-size rule sits
#: beside the heads' rule (planning.heads), a text file's decoding beside its rules
#: (data.text_file), a view of some samples beside the Dataset it wraps (data.base),
#: and the profile takes the ranks per node from the run's process groups
#: (ProfileSettings.ranks_per_node) instead of reading the environment again; one
#: fewer since a schedule is checked against the model's declared SP and ring caps
#: beside the heads' rule (planning.heads.check_max_sp_size, check_max_ring_size); one
#: fewer since the data layer is handed a latent dataset's draws, not the [training]
#: section (data.sources.build_run_data(draws=)); one more since the trainer records
#: its settings without what its start did once (overwrite, resume_from, expect_sha256:
#: settings.run_settings.recorded_settings), so that a run folder's own config.toml
#: resumes it
CEILINGS = {"stays": 122, "climbs": 23, "entries": 4}
#: the fifth round's target
TARGET = {"stays": 60, "climbs": 8, "entries": 4}

Key = tuple[str, str]  # (module, qualified function name)


@dataclass
class Module:
    name: str
    package: bool
    tree: ast.Module
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    #: local name -> the dotted name it was imported as (module or module.attribute)
    imports: dict[str, str] = field(default_factory=dict)
    #: a package's lazy table of public names: name -> module
    lazy: dict[str, str] = field(default_factory=dict)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.name.split(".")
    keep = len(parts) - node.level + (1 if module.package else 0)
    return ".".join(parts[:keep] + ([node.module] if node.module else []))


def _index(module: Module) -> None:
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    module.functions[f"{node.name}.{item.name}"] = item
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
                for k, v in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        module.lazy[k.value] = v.value
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.imports[alias.asname] = alias.name
                else:
                    module.imports[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"


def read_package(root: Path = ROOT) -> dict[str, Module]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        module = Module(name, path.name == "__init__.py", ast.parse(path.read_text("utf-8")))
        _index(module)
        modules[name] = module
    return modules


#: what a name stands for: ("module", name), ("function", key) or ("class", key)
Target = tuple[str, object]


class Walk:
    """One walk of the settings' path over the modules of ``modules``."""

    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.path: list[Key] = []
        self.seen: set[Key] = set()

    # --- what a name means --------------------------------------------------------
    def symbol(self, module_name: str, name: str, depth: int = 0) -> Target | None:
        """What ``name`` means at the top of module ``module_name``."""
        module = self.modules.get(module_name)
        if module is None or depth > 10:
            return None
        if name in module.functions:
            return ("function", (module_name, name))
        if name in module.classes:
            return ("class", (module_name, name))
        dotted = module.imports.get(name) or module.lazy.get(name)
        if dotted is None:
            return None
        if name in module.lazy and name not in module.imports:
            return self.symbol(dotted, name, depth + 1)
        return self.dotted(dotted, depth + 1)

    def dotted(self, dotted: str, depth: int = 0) -> Target | None:
        if dotted in self.modules:
            return ("module", dotted)
        base, _, attr = dotted.rpartition(".")
        return self.symbol(base, attr, depth) if base in self.modules else None

    def method(self, cls: Key, name: str, depth: int = 0) -> Key | None:
        """``cls.name`` (its own, else a base class's of the package)."""
        module_name, class_name = cls
        qualname = f"{class_name}.{name}"
        if qualname in self.modules[module_name].functions:
            return (module_name, qualname)
        for base in self.modules[module_name].classes[class_name].bases:
            if isinstance(base, ast.Name) and depth < 10:
                target = self.symbol(module_name, base.id)
                if target and target[0] == "class":
                    found = self.method(target[1], name, depth + 1)  # type: ignore[arg-type]
                    if found:
                        return found
        return None

    def annotated(self, module: str, annotation: ast.expr | None) -> Key | None:
        """The package class an annotation names (``Cls``, ``Cls | None``,
        ``Optional[Cls]``, ``"Cls"``), else None."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.BinOp):
            return self.annotated(module, annotation.left) or self.annotated(
                module, annotation.right
            )
        if isinstance(annotation, ast.Subscript) and _dotted(annotation.value) == "Optional":
            return self.annotated(module, annotation.slice)
        if isinstance(annotation, (ast.Name, ast.Attribute)):
            target = self.target_of(module, annotation, {})
            if target and target[0] == "class":
                cls: Key = target[1]  # type: ignore[assignment]
                return None if self.is_protocol(cls) else cls
        return None

    def is_protocol(self, cls: Key) -> bool:
        """Whether ``cls`` is a ``typing.Protocol`` (an interface: the object a name it
        annotates holds is of another class, whose methods the source does not say)."""
        module_name, class_name = cls
        bases = self.modules[module_name].classes[class_name].bases
        return any(_dotted(b) in ("Protocol", "typing.Protocol") for b in bases)

    def field_type(self, cls: Key, name: str, depth: int = 0) -> Key | None:
        """The class of attribute ``name`` of ``cls``: its annotated field, or what
        its ``__init__`` assigns ``self.name`` from a class's call (a base's too)."""
        module_name, class_name = cls
        node = self.modules[module_name].classes[class_name]
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and _dotted(item.target) == name:
                return self.annotated(module_name, item.annotation)
        init = self.modules[module_name].functions.get(f"{class_name}.__init__")
        for item in ast.walk(init) if init else ():
            if isinstance(item, ast.Assign) and isinstance(item.value, ast.Call):
                if any(_dotted(t) == f"self.{name}" for t in item.targets):
                    target = self.target_of(module_name, item.value.func, {})
                    if target and target[0] == "class":
                        return target[1]  # type: ignore[return-value]
        for base in node.bases if depth < 10 else ():
            target = self.target_of(module_name, base, {})
            if target and target[0] == "class":
                found = self.field_type(target[1], name, depth + 1)  # type: ignore[arg-type]
                if found:
                    return found
        return None

    def type_of(self, module: str, expr: ast.expr, types: dict[str, Key]) -> Key | None:
        """The package class of the object ``expr`` holds, where the source says."""
        if isinstance(expr, ast.Name):
            return types.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.type_of(module, expr.value, types)
            return self.field_type(owner, expr.attr) if owner else None
        if isinstance(expr, ast.Call):
            target = self.target_of(module, expr.func, types)
            return target[1] if target and target[0] == "class" else None  # type: ignore[return-value]
        return None

    def target_of(self, module: str, expr: ast.expr, types: dict[str, Key]) -> Target | None:
        if isinstance(expr, ast.Name):
            return self.symbol(module, expr.id)
        if isinstance(expr, ast.Attribute):
            outer = self.target_of(module, expr.value, types)
            if outer and outer[0] == "module":
                return self.dotted(f"{outer[1]}.{expr.attr}")
        return None

    def callee(self, key: Key, call: ast.Call, types: dict[str, Key]) -> tuple[Key, bool] | None:
        """The function ``call`` enters and whether it binds a first argument (a
        method called on an object, or a class's ``__init__``)."""
        module = key[0]
        func = call.func
        target = self.target_of(module, func, types)
        if target and target[0] == "function":
            return target[1], False  # type: ignore[return-value]
        if target and target[0] == "class":
            init = self.method(target[1], "__init__")  # type: ignore[arg-type]
            return (init, True) if init else None
        if not isinstance(func, ast.Attribute):
            return None
        owner = self.target_of(module, func.value, types)
        if owner and owner[0] == "class":  # Cls.method(...)
            found = self.method(owner[1], func.attr)  # type: ignore[arg-type]
            return (found, _binds(self.function(found))) if found else None
        cls = self.type_of(module, func.value, types)
        found = self.method(cls, func.attr) if cls else None
        return (found, True) if found else None

    def function(self, key: Key) -> ast.FunctionDef:
        return self.modules[key[0]].functions[key[1]]

    # --- the walk -----------------------------------------------------------------
    def walk(self, key: Key, given: set[str]) -> None:
        if key in self.seen:
            return
        self.seen.add(key)
        self.path.append(key)
        function = self.function(key)
        derived = _derived(function, given)
        types = _local_types(self, key, function)
        for call in _calls_in_order(function):
            found = self.callee(key, call, types)
            if found is None:
                continue
            callee, bound = found
            params = _bind(call, self.function(callee), bound, derived)
            if params:
                self.walk(callee, params)


def _calls_in_order(node: ast.AST):
    """The calls under ``node`` in the order they run: statements in turn, a call's
    function and arguments before the call itself."""
    for child in ast.iter_child_nodes(node):
        yield from _calls_in_order(child)
    if isinstance(node, ast.Call):
        yield node


def _binds(function: ast.FunctionDef) -> bool:
    """Whether a call through the class binds a first argument (a classmethod)."""
    return any(isinstance(d, ast.Name) and d.id == "classmethod" for d in function.decorator_list)


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        inner = _dotted(expr.value)
        return f"{inner}.{expr.attr}" if inner else None
    return None


def _reads(expr: ast.AST | None, derived: set[str]) -> bool:
    """Whether ``expr`` reads a name (or ``self.attr``) derived from the settings."""
    if expr is None:
        return False
    for node in ast.walk(expr):
        if isinstance(node, (ast.Name, ast.Attribute)) and _dotted(node) in derived:
            return True
    return False


def _stored(target: ast.expr) -> list[str]:
    """The names (and ``self.attr`` chains) an assignment target stores into."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _stored(elt)]
    if isinstance(target, ast.Starred):
        return _stored(target.value)
    if isinstance(target, ast.Subscript):
        return _stored(target.value)
    name = _dotted(target)
    return [name] if name else []


def _flows(node: ast.AST) -> list[tuple[ast.AST | None, list[ast.expr]]]:
    """``(source, targets)`` for each way ``node`` assigns."""
    if isinstance(node, ast.Assign):
        return [(node.value, node.targets)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
        return [(node.value, [node.target])]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.iter, [node.target])]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(i.context_expr, [i.optional_vars]) for i in node.items if i.optional_vars]
    return []


def _derived(function: ast.FunctionDef, given: set[str]) -> set[str]:
    """Every name of ``function`` derived from its parameters ``given``."""
    derived = set(given)
    flows = [flow for node in ast.walk(function) for flow in _flows(node)]
    grew = True
    while grew:
        grew = False
        for source, targets in flows:
            if _reads(source, derived):
                new = {n for t in targets for n in _stored(t)} - derived
                if new:
                    derived |= new
                    grew = True
    return derived


def _local_types(walk: Walk, key: Key, function: ast.FunctionDef) -> dict[str, Key]:
    """Locals whose class the source says: an annotated parameter, ``self`` of a
    method, or ``x = Cls(...)``."""
    module, qualname = key
    types: dict[str, Key] = {}
    args = function.args
    params = args.posonlyargs + args.args + args.kwonlyargs
    if "." in qualname and params and not _binds(function):
        types[params[0].arg] = (module, qualname.split(".")[0])
    for arg in params:
        found = walk.annotated(module, arg.annotation)
        if found:
            types[arg.arg] = found
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            found = walk.type_of(module, node.value, types)
            if found and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                types[node.targets[0].id] = found
    return types


def _bind(call: ast.Call, callee: ast.FunctionDef, bound: bool, derived: set[str]) -> set[str]:
    """The parameters of ``callee`` that ``call`` hands a derived value."""
    args = callee.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    out: set[str] = set()
    if bound and positional:
        first, positional = positional[0], positional[1:]
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if isinstance(receiver, (ast.Name, ast.Attribute)) and _reads(receiver, derived):
            out.add(first)
    named = positional + [a.arg for a in args.kwonlyargs]
    for i, arg in enumerate(call.args):
        if not _reads(arg, derived):
            continue
        if isinstance(arg, ast.Starred):
            out.update(positional[i:])
            out.update([args.vararg.arg] if args.vararg else [])
        elif i < len(positional):
            out.add(positional[i])
        elif args.vararg:
            out.add(args.vararg.arg)
    for keyword in call.keywords:
        if not _reads(keyword.value, derived):
            continue
        if keyword.arg is None:
            out.update(named)
        elif keyword.arg in named:
            out.add(keyword.arg)
        elif args.kwarg:
            out.add(args.kwarg.arg)
    return out


@dataclass(frozen=True)
class PathMeasure:
    stays: list[str]
    climbs: int
    entries: Counter

    @property
    def most_entries(self) -> int:
        return max(self.entries.values())


def measure(path: list[Key]) -> PathMeasure:
    """Stays, climbs back up and entries per module of a path of functions."""
    stays: list[str] = []
    for module, _ in path:
        if not stays or stays[-1] != module:
            stays.append(module)
    ranks = [RANK[layer_of(m)] for m in stays]
    climbs = sum(1 for before, now in zip(ranks, ranks[1:]) if now > before)
    return PathMeasure(stays, climbs, Counter(stays))


def settings_path(root: Path = ROOT) -> list[Key]:
    walk = Walk(read_package(root))
    module, function, parameter = START
    walk.walk((module, function), {parameter})
    return walk.path


def test_the_settings_path_stays_under_its_ceilings():
    path = settings_path()
    assert ("datacentric.train.assemble", "assemble_run") in path, "the walk lost the run"
    found = measure(path)
    numbers = {"stays": len(found.stays), "climbs": found.climbs}
    numbers["entries"] = found.most_entries
    print(
        f"settings path from train_rank: {numbers['stays']} stays, {numbers['climbs']} "
        f"climbs back up, at most {numbers['entries']} entries per module "
        f"({found.entries.most_common(4)}); target {TARGET}"
    )
    over = {k: v for k, v in numbers.items() if v > CEILINGS[k]}
    assert not over, f"the settings' path grew past its ceilings {CEILINGS}: {numbers}"


PLANTED = {
    "train/__init__.py": "",
    "train/trainer.py": """
from datacentric.models import source
from datacentric.profiling.factory import CostModel
from datacentric.train import build


def train_rank(config, groups=None):
    spec = source.spec_of(config.model)
    if config.never:
        build.only_in_a_branch(spec)
    build.unrelated(groups)
    cost = CostModel(spec)
    cost.price(1)
    return build.last(x=[s for s in spec])
""",
    "train/build.py": """
from datacentric.models.source import spec_of


def only_in_a_branch(spec):
    return spec_of(spec)


def unrelated(groups):
    return spec_of(groups)


def last(x):
    return x
""",
    "models/__init__.py": "",
    "models/source.py": """
def spec_of(model):
    return _described(model)


def _described(model):
    return model
""",
    "profiling/__init__.py": "",
    "profiling/factory.py": """
from datacentric.models.source import spec_of


class CostModel:
    def __init__(self, spec):
        self.spec = spec

    def price(self, tokens):
        return spec_of(self.spec)
""",
}


def test_the_walk_follows_the_settings_and_what_derives_from_them(tmp_path):
    """A planted package: the settings reach ``spec_of`` (and its helper), a branch,
    a class's ``__init__`` and, through the object built from them, its method;
    ``unrelated`` gets no part of them and is not entered."""
    root = tmp_path / "datacentric"
    for name, text in PLANTED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "__init__.py").write_text("")
    path = settings_path(root)
    assert [f"{m.removeprefix('datacentric.')}:{f}" for m, f in path] == [
        "train.trainer:train_rank",
        "models.source:spec_of",
        "models.source:_described",
        "train.build:only_in_a_branch",
        "profiling.factory:CostModel.__init__",
        "profiling.factory:CostModel.price",
        "train.build:last",
    ]
    found = measure(path)
    # train -> models -> train (climb) -> profiling (down) -> train (climb)
    assert found.stays[-1] == "datacentric.train.build"
    assert (len(found.stays), found.climbs, found.most_entries) == (5, 2, 2)


PROTOCOL_PLANTED = {
    "train/__init__.py": "",
    "train/trainer.py": """
from datacentric.data.base import Dataset, Samples


def train_rank(config):
    through_the_interface(config.data)
    through_the_class(config.data)


def through_the_interface(data: Dataset):
    return data.pack(1)


def through_the_class(data: Samples):
    return data.pack(1)
""",
    "data/__init__.py": "",
    "data/base.py": """
from typing import Protocol


class Dataset(Protocol):
    def pack(self, n): ...


class Samples:
    def pack(self, n):
        return n
""",
}


def test_a_call_through_a_protocol_is_not_followed(tmp_path):
    """A parameter annotated with a ``Protocol`` holds an object of some other class:
    the protocol's stub is not entered; the same call through an annotated class is."""
    root = tmp_path / "datacentric"
    for name, text in PROTOCOL_PLANTED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "__init__.py").write_text("")
    assert [f"{m.removeprefix('datacentric.')}:{f}" for m, f in settings_path(root)] == [
        "train.trainer:train_rank",
        "train.trainer:through_the_interface",
        "train.trainer:through_the_class",
        "data.base:Samples.pack",
    ]
