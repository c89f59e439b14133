"""Each component of a run receives only its own section of the settings.

Only the top of a run holds the whole settings (:data:`TOP`: ``assemble_run``,
``Trainer.__init__``, ``train_rank``..., the command line and the settings package
itself); every function below it takes the sections it reads (``checkpoint:
CheckpointConfig``, ``training: TrainingConfig``). The check keys on the settings'
TYPE, not on variable names: it reads every module of the package for the names the
whole-settings class goes by (:data:`WHOLE` and its aliases), the functions that return
it (``load_config``, ``TrainConfig.updated``...) and the attributes that hold it (a
field annotated with it, ``self.x = settings``). Then, outside the top, a function
fails, named ``file:function``, when it takes a parameter annotated with that type,
reads a section off anything holding it (``settings.data``, ``run.config.job``, a local
it was copied into), keeps it in an attribute, or reads two sections off one
unannotated parameter (the whole settings by its use); a class field annotated with it
fails too. A section is read by attribute (``settings.data``), by
``getattr(settings, "data")`` or by ``settings.section(name)`` (any name: the whole
settings), off a parameter or a local, typed or not. Planted faults show the check fails
on each.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from repo_paths import ROOT

from datacentric.settings import TrainConfig
from datacentric.settings.layout import SECTIONS

PACKAGE = ROOT / "datacentric"
#: The type of the whole settings (one object of every section).
WHOLE = TrainConfig.__name__
#: The functions that may hold the whole settings: the top of a run (``file:qualname``).
TOP = {
    "datacentric/train/assemble.py:assemble_run",
    "datacentric/train/trainer.py:Trainer.__init__",
    "datacentric/train/trainer.py:train_rank",
    "datacentric/train/trainer.py:train_rank_in_locked_folder",
    # the measured comparison launches one run per policy (train_rank on each rank)
    "datacentric/train/comparison/measured_comparison.py:compare_policies",
    "datacentric/train/comparison/measured_comparison.py:run_policy",
    "datacentric/train/comparison/measured_comparison.py:train_rank_clocked",
    # a drop-in trainer resolves its settings from the caller's arguments, as a command does
    "datacentric/integrations/session.py:DropInTrainer._build_trainer",
}
#: The attributes that may hold it: what the assembly hands the trainer, which keeps it
#: only to write the run's settings files.
TOP_ATTRIBUTES = {
    "datacentric/train/assemble.py:Run.config",
    "datacentric/train/trainer.py:Trainer.config",
}
#: Folders whose every function may: the commands' entry points (each resolves its own
#: settings) and the settings package (it builds, checks and writes the whole object).
TOP_FOLDERS = ("datacentric/cli/", "datacentric/settings/")


@dataclass
class Facts:
    """What the package says about the whole settings' type, read from every module."""

    types: set[str] = field(default_factory=lambda: {WHOLE})
    """The names the type goes by (the class, an alias, an import ``as``)."""
    makers: set[str] = field(default_factory=set)
    """Functions and methods annotated to return it (``load_config``, ``updated``)."""
    holders: set[str] = field(default_factory=set)
    """Attribute names annotated with it or assigned it (``Run.config``)."""


Scope = tuple[str, ast.AST, list[ast.AST]]


def _scopes(tree: ast.AST) -> list[Scope]:
    """Every function and class of ``tree``: its qualified name (``Class.method``), its
    node and its own nodes (not those of a function or class inside), in source order;
    one walk of the tree."""
    scopes: list[Scope] = []

    def visit(node: ast.AST, prefix: str, own: list[ast.AST] | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                mine: list[ast.AST] = []
                scopes.append((f"{prefix}{child.name}", child, mine))
                visit(child, f"{prefix}{child.name}.", mine)
                continue
            if own is not None:
                own.append(child)
            visit(child, prefix, own)

    visit(tree, "", None)
    return scopes


def _functions(tree: ast.AST) -> list[Scope]:
    """The functions and methods of :func:`_scopes`."""
    return [s for s in _scopes(tree) if isinstance(s[1], ast.FunctionDef | ast.AsyncFunctionDef)]


def _names_type(annotation: ast.expr | None, types: set[str]) -> bool:
    """``annotation`` names one of ``types`` (``T``, ``mod.T``, ``"T"``, ``T | None``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    return any(
        (isinstance(n, ast.Name) and n.id in types)
        or (isinstance(n, ast.Attribute) and n.attr in types)
        or (isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in types)
        for n in ast.walk(annotation)
    )


def read_facts(trees: list[ast.AST]) -> Facts:
    """The type's names, its makers and its holders, over ``trees`` (every module)."""
    facts = Facts()
    nodes = [node for tree in trees for node in ast.walk(tree)]
    for _ in range(2):  # an alias of an alias
        for node in nodes:
            _read_fact(node, facts)
    for tree in trees:  # attributes assigned the whole settings (``self.x = settings``)
        for _, function, own in _functions(tree):
            held = _holding_names(function, own, facts, attributes=False)
            for node in own:
                if isinstance(node, ast.Assign) and _holds(node.value, held, facts, False):
                    facts.holders |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
    return facts


def _read_fact(node: ast.AST, facts: Facts) -> None:
    """What one node says: an alias, an import ``as``, a maker, an annotated holder."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name | ast.Attribute):
        value = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
        if value in facts.types:
            facts.types |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    elif isinstance(node, ast.ImportFrom):
        facts.types |= {a.asname for a in node.names if a.asname and a.name in facts.types}
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if _names_type(node.returns, facts.types):
            facts.makers.add(node.name)
    elif isinstance(node, ast.AnnAssign) and _names_type(node.annotation, facts.types):
        if isinstance(node.target, ast.Name | ast.Attribute):
            target = node.target
            facts.holders.add(target.id if isinstance(target, ast.Name) else target.attr)


def _holding_names(
    function: ast.AST, own: list[ast.AST], facts: Facts, attributes: bool = True
) -> set[str]:
    """The local names of ``function`` that hold the whole settings: parameters
    annotated with its type, and locals assigned something that holds it (``attributes``:
    read off an attribute known by its name, ``whole = run.config``)."""
    args = function.args  # type: ignore[attr-defined]
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    held = {a.arg for a in every if a is not None and _names_type(a.annotation, facts.types)}
    for node in own:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            typed = isinstance(node, ast.AnnAssign) and _names_type(node.annotation, facts.types)
            if typed or _holds(node.value, held, facts, attributes):
                held |= {t.id for t in targets if isinstance(t, ast.Name)}
    return held


def _holds(node: ast.expr, held: set[str], facts: Facts, attributes: bool = True) -> bool:
    """``node`` is the whole settings: a holding name or (``attributes``) attribute, a
    call of the type or of a maker, ``dataclasses.replace`` of one. (An attribute is
    known by its name alone, ``run.config``, so what is kept in an attribute is judged
    without them: ``self.config = model.config`` is a model's configuration.)"""
    if isinstance(node, ast.Name):
        return node.id in held
    if isinstance(node, ast.Attribute):
        return attributes and node.attr in facts.holders
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in facts.types or name in facts.makers:
            return True
        return (
            name == "replace" and bool(node.args) and _holds(node.args[0], held, facts, attributes)
        )
    return False


def violations(source: str | ast.AST, path: str, facts: Facts) -> list[str]:
    """``path:function`` and what is wrong, for each function and class of ``source``
    (the module at ``path``, relative to the repository, or its tree) that holds more
    than its own sections."""
    if path.startswith(TOP_FOLDERS):
        return []
    tree = ast.parse(source) if isinstance(source, str) else source
    found = []
    for name, scope, own in _scopes(tree):
        where = f"{path}:{name}"
        if isinstance(scope, ast.ClassDef):
            found += _class_violations(where, scope, path, facts)
        elif where not in TOP:
            found += _function_violations(where, scope, own, facts)
    return found


def _class_violations(where: str, cls: ast.ClassDef, path: str, facts: Facts) -> list[str]:
    return [
        f"{where} holds the whole settings in {node.target.id}"
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and _names_type(node.annotation, facts.types)
        and f"{path}:{cls.name}.{node.target.id}" not in TOP_ATTRIBUTES
    ]


def _function_violations(
    where: str, function: ast.AST, own: list[ast.AST], facts: Facts
) -> list[str]:
    args = function.args  # type: ignore[attr-defined]
    every = [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a is not None]
    found = [
        f"{where} takes {a.arg}: {WHOLE}" for a in every if _names_type(a.annotation, facts.types)
    ]
    held = _holding_names(function, own, facts)
    kept = _holding_names(function, own, facts, attributes=False)
    untyped = _untyped_names(every, own)
    typed_reads: dict[str, set[str]] = {}
    untyped_reads: dict[str, set[str]] = {}
    for node in own:
        read = _section_read(node)
        if read is not None:
            base, section = read
            if _holds(base, held, facts):
                typed_reads.setdefault(ast.unparse(base), set()).add(section)
            elif isinstance(base, ast.Name) and base.id in untyped:
                untyped_reads.setdefault(base.id, set()).add(section)
        elif isinstance(node, ast.Assign) and _holds(node.value, kept, facts, False):
            into = [ast.unparse(t) for t in node.targets if isinstance(t, ast.Attribute)]
            found += [f"{where} keeps the whole settings in {k}" for k in into]
    for base, sections in typed_reads.items():
        found.append(f"{where} reads {', '.join(sorted(sections))} off the whole settings ({base})")
    for base, sections in untyped_reads.items():
        if len(sections) > 1 or any(s.startswith("section(") for s in sections):
            found.append(f"{where} reads {', '.join(sorted(sections))} off {base} (untyped)")
    return found


def _untyped_names(params: list[ast.arg], own: list[ast.AST]) -> set[str]:
    """The names of a function whose type it does not say: parameters without an
    annotation (but ``self``, ``cls``) and locals assigned without one."""
    names = {a.arg for a in params if a.annotation is None and a.arg not in ("self", "cls")}
    for node in own:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.For | ast.With | ast.NamedExpr):
            targets = [node.target] if not isinstance(node, ast.With) else []
            targets += [i.optional_vars for i in getattr(node, "items", []) if i.optional_vars]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    annotated = [n.target for n in own if isinstance(n, ast.AnnAssign)]
    return names - {t.id for t in annotated if isinstance(t, ast.Name)}


def _section_read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``(what it is read off, the section)`` when ``node`` reads a section: an
    attribute (``x.data``), ``getattr(x, "data")`` or ``x.section(name)`` (any name:
    ``"section(NAME)"``); else None."""
    if isinstance(node, ast.Attribute) and node.attr in SECTIONS:
        return node.value, node.attr
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
        name = node.args[1]
        if isinstance(name, ast.Constant) and name.value in SECTIONS:
            return node.args[0], str(name.value)
    if isinstance(func, ast.Attribute) and func.attr == "section" and node.args:
        return func.value, f"section({ast.unparse(node.args[0])})"
    return None


@functools.cache
def _package() -> tuple[dict[str, ast.AST], Facts]:
    trees = {
        module.relative_to(ROOT).as_posix(): ast.parse(module.read_text(encoding="utf-8"))
        for module in sorted(PACKAGE.rglob("*.py"))
    }
    return trees, read_facts(list(trees.values()))


def test_every_component_receives_only_its_own_sections():
    trees, facts = _package()
    assert {"load_config", "build_config", "updated"} <= facts.makers  # read, not listed
    assert "config" in facts.holders  # Run.config, Trainer.config
    found = [v for path, tree in trees.items() for v in violations(tree, path, facts)]
    assert not found, f"give these the section(s) they read, not {WHOLE}:\n" + "\n".join(found)


def test_the_trainer_keeps_the_whole_settings_only_to_write_them():
    tree = ast.parse((ROOT / "datacentric/train/trainer.py").read_text(encoding="utf-8"))
    readers = {
        name
        for name, _, own in _functions(tree)
        for node in own
        if isinstance(node, ast.Attribute)
        and node.attr == "config"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    # __init__ records them (settings_json, what the run's files and checkpoints hold)
    assert readers == {"Trainer.__init__"}


PLANTED = """
import dataclasses
from datacentric.settings import TrainConfig, load_config
from datacentric.settings import TrainConfig as Settings

RunSettings = TrainConfig

def reads_data(settings: TrainConfig):
    return settings.data.dataset

def reads_job(settings: "RunSettings | None"):
    return settings.job.out

def through_the_run(run):
    return run.config.training.lr

def through_a_local(run, n: int):
    whole = run.config
    return whole.checkpoint.keep_last

def made_here(out: str):
    resolved = dataclasses.replace(load_config(None, out=out))
    return resolved.metrics.log_every

class Saver:
    def save(self):
        return self.config.checkpoint.keep_last

class Holder:
    settings: Settings

class Keeper:
    def keep(self, n: int, whole: RunSettings):
        self.kept = whole

def untyped(config):
    def inner():
        return config.metrics
    return config.job.out, config.data.dataset

def one_section(checkpoint, config):
    return checkpoint.keep_last, config.job

class Run:
    config: TrainConfig

def assemble_run(config: TrainConfig, groups):
    return config.job, config.data, config.model

def by_getattr(settings: TrainConfig):
    return getattr(settings, "data").dataset

def by_section_name(settings: TrainConfig, name: str):
    return settings.section(name)

def untyped_local(run):
    found = run.settings_of()
    return found.job.out, found.data.dataset

def untyped_by_name(config, name: str):
    return config.section(name)

def untyped_by_getattr(config):
    return getattr(config, "job"), getattr(config, "lora")

def one_untyped_local(run):
    found = run.result()
    return found.data
"""


def test_planted_faults_fail_the_check_naming_file_and_function():
    _, facts = _package()
    path = "datacentric/train/assemble.py"
    planted = read_facts([ast.parse(PLANTED)])
    facts = Facts(
        facts.types | planted.types, facts.makers | planted.makers, facts.holders | planted.holders
    )
    assert {"RunSettings", "Settings"} <= facts.types
    found = violations(PLANTED, path, facts)
    assert found == [
        f"{path}:reads_data takes settings: TrainConfig",
        f"{path}:reads_data reads data off the whole settings (settings)",
        f"{path}:reads_job takes settings: TrainConfig",
        f"{path}:reads_job reads job off the whole settings (settings)",
        f"{path}:through_the_run reads training off the whole settings (run.config)",
        f"{path}:through_a_local reads checkpoint off the whole settings (whole)",
        f"{path}:made_here reads metrics off the whole settings (resolved)",
        f"{path}:Saver.save reads checkpoint off the whole settings (self.config)",
        f"{path}:Holder holds the whole settings in settings",
        f"{path}:Keeper.keep takes whole: TrainConfig",
        f"{path}:Keeper.keep keeps the whole settings in self.kept",
        f"{path}:untyped reads data, job off config (untyped)",
        f"{path}:by_getattr takes settings: TrainConfig",
        f"{path}:by_getattr reads data off the whole settings (settings)",
        f"{path}:by_section_name takes settings: TrainConfig",
        f"{path}:by_section_name reads section(name) off the whole settings (settings)",
        f"{path}:untyped_local reads data, job off found (untyped)",
        f"{path}:untyped_by_name reads section(name) off config (untyped)",
        f"{path}:untyped_by_getattr reads job, lora off config (untyped)",
    ], "\n".join(found)
    # the same source in a command's module is the top of a run
    assert violations(PLANTED, "datacentric/cli/train.py", facts) == []
