"""Each component of a run receives only its own section of the settings.

Only the top of a run holds the whole :class:`~datacentric.settings.TrainConfig`
(:data:`TOP`: ``assemble_run``, ``Trainer.__init__``, ``train_rank``..., the command
line and the settings package itself); every function below it takes the sections it
reads (``checkpoint: CheckpointConfig``, ``training: TrainingConfig``). The check parses
every module of the package: a function elsewhere that takes a parameter annotated
``TrainConfig``, or reads two top-level sections off a ``config``/``self.config`` chain,
fails, named ``file:function``. Planted faults show the check fails on each.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from repo_paths import ROOT

from datacentric.settings.layout import SECTIONS

PACKAGE = ROOT / "datacentric"
#: The functions that may hold the whole settings: the top of a run (``file:qualname``).
TOP = {
    "datacentric/train/assemble.py:assemble_run",
    "datacentric/train/trainer.py:Trainer.__init__",
    "datacentric/train/trainer.py:train_rank",
    "datacentric/train/trainer.py:train_rank_in_locked_folder",
    # the measured comparison launches one run per policy (train_rank on each rank)
    "datacentric/train/measured_comparison.py:compare_policies",
    "datacentric/train/measured_comparison.py:run_policy",
    "datacentric/train/measured_comparison.py:train_rank_clocked",
}
#: Folders whose every function may: the commands' entry points (each resolves its own
#: settings) and the settings package (it builds, checks and writes the whole object).
TOP_FOLDERS = ("datacentric/cli/", "datacentric/settings/")


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method of ``tree`` with its qualified name (``Class.method``)."""

    def visit(node: ast.AST, prefix: str) -> Iterator:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{child.name}", child
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``function``'s own body (not those of a function or class inside)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _names_train_config(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "TrainConfig" in annotation.value
    return any(
        (isinstance(n, ast.Name) and n.id == "TrainConfig")
        or (isinstance(n, ast.Attribute) and n.attr == "TrainConfig")
        for n in ast.walk(annotation)
    )


def _section_read(node: ast.AST) -> str | None:
    """The section ``node`` reads when it is ``config.<section>`` or
    ``self.config.<section>``."""
    if not isinstance(node, ast.Attribute) or node.attr not in SECTIONS:
        return None
    base = node.value
    if isinstance(base, ast.Name) and base.id == "config":
        return node.attr
    if (
        isinstance(base, ast.Attribute)
        and base.attr == "config"
        and isinstance(base.value, ast.Name)
        and base.value.id == "self"
    ):
        return node.attr
    return None


def violations(source: str, path: str) -> list[str]:
    """``path:function`` and what is wrong, for each function of ``source`` (the module
    at ``path``, relative to the repository) that holds more than its own sections."""
    if path.startswith(TOP_FOLDERS):
        return []
    found = []
    for name, function in _functions(ast.parse(source)):
        where = f"{path}:{name}"
        if where in TOP:
            continue
        args = function.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for arg in every:
            if arg is not None and _names_train_config(arg.annotation):
                found.append(f"{where} takes {arg.arg}: TrainConfig")
        sections = sorted({s for node in _own_nodes(function) if (s := _section_read(node))})
        if len(sections) > 1:
            found.append(f"{where} reads sections {', '.join(sections)} of the whole settings")
    return found


def test_every_component_receives_only_its_own_sections():
    found = []
    for module in sorted(PACKAGE.rglob("*.py")):
        path = module.relative_to(ROOT).as_posix()
        found += violations(module.read_text(encoding="utf-8"), path)
    assert not found, "give these the section(s) they read, not TrainConfig:\n" + "\n".join(found)


def test_the_trainer_keeps_the_whole_settings_only_to_write_them():
    path = "datacentric/train/trainer.py"
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    readers = {
        name
        for name, function in _functions(tree)
        for node in _own_nodes(function)
        if isinstance(node, ast.Attribute)
        and node.attr == "config"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    assert readers == {"Trainer.__init__", "Trainer._write_run_files"}


PLANTED = """
from datacentric.settings import TrainConfig

def resume(config: TrainConfig, out):
    return config.checkpoint.resume

def named(settings: "TrainConfig"):
    return settings

class Saver:
    def save(self):
        return self.config.checkpoint.keep_last, self.config.training.lr

    def one_section(self):
        return self.config.checkpoint.keep_last, self.config.checkpoint.resume

def reads_two(config):
    def inner():
        return config.metrics
    return config.job.out, config.data.dataset

def assemble_run(config: TrainConfig, groups):
    return config.job, config.data, config.model
"""


def test_planted_faults_fail_the_check_naming_file_and_function():
    found = violations(PLANTED, "datacentric/train/assemble.py")
    assert found == [
        "datacentric/train/assemble.py:resume takes config: TrainConfig",
        "datacentric/train/assemble.py:named takes settings: TrainConfig",
        "datacentric/train/assemble.py:Saver.save reads sections checkpoint, training "
        "of the whole settings",
        "datacentric/train/assemble.py:reads_two reads sections data, job of the whole settings",
    ]
    # the same source in a command's module is the top of a run
    assert violations(PLANTED, "datacentric/cli/train.py") == []
