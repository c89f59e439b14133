"""Each settings section is one dataclass: the settings hold it, and the components that
read the section take it as it is (the pipeline and the policies take ``[scheduling]``'s)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import warnings
from pathlib import Path

import pytest

from datacentric.settings import POLICY_NAMES, SECTIONS, SchedulingConfig, build_config
from datacentric.settings.schema import ConfigError

PACKAGE = Path(__file__).resolve().parents[3] / "datacentric"


def _classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(str(path.relative_to(PACKAGE)), n) for n in ast.walk(tree)]
    return [(where, n) for where, n in found if isinstance(n, ast.ClassDef)]


def test_each_section_is_one_dataclass_defined_once_in_the_settings():
    names = {cls.__name__ for cls in SECTIONS.values()}
    assert len(names) == len(SECTIONS)
    for cls in SECTIONS.values():
        assert dataclasses.is_dataclass(cls) and cls.__module__.startswith("datacentric.settings.")
        assert cls.__mro__[1:] == (object,), f"{cls.__name__} is made of other types"
    defined = [(where, n.name) for where, n in _classes() if n.name in names]
    assert sorted(name for _, name in defined) == sorted(names), defined
    subclasses = [
        f"{where}: {node.name}"
        for where, node in _classes()
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in names
    ]
    assert not subclasses, "a second type of a section: " + ", ".join(subclasses)


def test_no_type_is_made_at_run_time():
    for path in sorted(PACKAGE.rglob("*.py")):
        assert "make_dataclass" not in path.read_text(encoding="utf-8"), path


def test_the_policies_take_the_scheduling_section_itself():
    from datacentric.scheduling import POLICIES, Pipeline
    from datacentric.scheduling.policy_input import PolicyInput

    assert SECTIONS["scheduling"] is SchedulingConfig
    assert tuple(POLICIES) == POLICY_NAMES
    assert "SchedulingConfig" in str(inspect.signature(Pipeline).parameters["options"])
    assert "SchedulingConfig" in str(PolicyInput.__annotations__["options"])
    section = SchedulingConfig(policy="static")
    pipeline = Pipeline([], object(), world_size=1, memory_cap_bytes=1, options=section)
    assert pipeline.policy == "static" and pipeline.options is section  # taken as it is


def test_older_names_of_a_setting_are_one_value():
    section = SchedulingConfig(tokens_per_iteration=512)
    assert (section.global_batch_tokens, section.tokens_per_iteration) == (512, 512)
    moved = section.updated(tokens_per_iteration=256)
    assert (moved.global_batch_tokens, moved.tokens_per_iteration) == (256, 256)
    with pytest.raises(ValueError, match="global_batch_tokens: 1, and 2 under its older name"):
        SchedulingConfig(global_batch_tokens=1, tokens_per_iteration=2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"reorder_window": 0}, "scheduling.reorder_window must be >= 1"),
        ({"max_micro_batch_size": 0}, "scheduling.max_micro_batch_size must be >= 1"),
        ({"global_batch_tokens": 4, "tokens_per_iteration": 8}, "not both"),
    ],
)
def test_a_bad_scheduling_value_is_a_config_error_naming_it(values, message):
    with pytest.raises(ConfigError, match=message):
        build_config(values)


@pytest.mark.parametrize("package", ["datacentric.settings", "datacentric.scheduling"])
def test_the_older_name_schedule_options_warns(package):
    import importlib

    module = importlib.import_module(package)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = module.ScheduleOptions
    assert old is SchedulingConfig
    assert any("SchedulingConfig" in str(w.message) for w in caught)


def test_one_micro_batch_bound_with_one_default():
    from datacentric.planning.plan import Plan
    from datacentric.planning.planner import plan_buckets
    from datacentric.scheduling import Pipeline
    from datacentric.settings.scheduling import MAX_MICRO_BATCH_SIZE

    assert SchedulingConfig().max_micro_batch_size == MAX_MICRO_BATCH_SIZE
    assert Plan({}, 1, 1, 1).option_batch_limit == MAX_MICRO_BATCH_SIZE
    bound = inspect.signature(plan_buckets).parameters["max_micro_batch_size"]
    assert bound.default == MAX_MICRO_BATCH_SIZE
    assert not [p for p in inspect.signature(Pipeline).parameters if "micro_batch" in p]


def test_model_config_names_only_the_model_section():
    from datacentric.models import configs
    from datacentric.settings.sections import ModelConfig

    assert SECTIONS["model"] is ModelConfig
    assert "ModelConfig" not in vars(configs)  # only an older name, which warns:
    with pytest.warns(DeprecationWarning, match="PresetConfig"):
        old = configs.ModelConfig
    assert old == configs.PresetConfig


def test_the_section_list_is_written_once():
    """``layout.Sections`` lists the sections; ``SECTIONS`` and ``TrainConfig``'s fields
    are read from it, and ``TrainConfig``'s typed keyword parameters (its public
    signature) name the same sections in the same order, each ``<its class> | None``."""
    from datacentric.settings import TrainConfig
    from datacentric.settings.layout import Sections

    listed = [(f.name, f.default_factory) for f in dataclasses.fields(Sections)]
    assert list(SECTIONS.items()) == listed
    assert [(f.name, f.default_factory) for f in dataclasses.fields(TrainConfig)] == listed
    params = inspect.signature(TrainConfig).parameters.values()
    keywords = [(p.name, p.annotation) for p in params if p.kind is p.KEYWORD_ONLY]
    assert keywords == [(name, f"{cls.__name__} | None") for name, cls in SECTIONS.items()]
    settings = TrainConfig(scheduling=SchedulingConfig(policy="static"))
    assert settings.scheduling.policy == "static"
