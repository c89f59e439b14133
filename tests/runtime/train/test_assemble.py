"""The one assembly of a run (train/assemble.py) and the one derivation of a run's spec."""

from __future__ import annotations

import pytest
import torch
from run_config import small_config

from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.planning.spec_derivation import spec_of_model
from datacentric.profiling.factory import get_model_spec, run_spec
from datacentric.train.assemble import assemble_run
from datacentric.train.checkpoints.checkpoint_load import weights_sha256
from datacentric.train.data_centric import DataCentric

pytestmark = pytest.mark.usefixtures("one_thread")


def test_assembly_builds_each_part_once_and_datacentric_shares_its_steps(tmp_path):
    config = small_config(tmp_path / "run", dataset_limit=1)
    run = assemble_run(config, ProcessGroups.local())
    assert run.dc.module is run.module and run.dc.dataset is run.dataset
    held = {id(p) for p in run.dc.model.parameters()}
    assert held == {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert run.step_metrics.shapes == run.dataset.shapes()
    # a user's DataCentric on the same model and data runs the same steps from the
    # model spec on: the same weights, plan and schedule
    torch.manual_seed(config.job.seed)
    module = build_model("llama")
    user = DataCentric(
        module,
        run.dataset,
        policy=config.scheduling.policy,
        cost_model=run.dc.pipeline.cost_model,
        tokens_per_iteration=config.scheduling.tokens_per_iteration,
        seed=config.job.seed,
        groups=ProcessGroups.local(),
        shard="fsdp2",
        options=config.scheduling,
    )
    assert weights_sha256(user.model.state_dict()) == weights_sha256(run.dc.model.state_dict())
    assert user.pipeline.plan.to_json() == run.dc.pipeline.plan.to_json()
    assert user.schedule(0).iterations == run.dc.schedule(0).iterations


def test_run_spec_reads_the_preset_or_the_built_model():
    preset = get_model_spec("llama")
    assert run_spec("llama") == preset
    module = build_model("llama", device="meta")
    assert run_spec("llama", module) == preset  # an analytic preset: its own spec
    assert spec_of_model(module, "llama") == preset  # the same read from the module
    assert run_spec("my-llama", module) == spec_of_model(module, "my-llama")


def test_the_sp_sizes_are_computed_once_for_the_cost_model_and_the_plan(tmp_path, monkeypatch):
    import datacentric.train.assemble as assemble
    import datacentric.train.data_centric as data_centric
    from datacentric.planning.heads import ulysses_sp_sizes

    real, worlds = ulysses_sp_sizes, []
    assert data_centric.ulysses_sp_sizes is real  # its old home still names it

    def counted(model, world_size):
        worlds.append(world_size)
        return real(model, world_size)

    monkeypatch.setattr(assemble, "ulysses_sp_sizes", counted)
    monkeypatch.setattr(data_centric, "ulysses_sp_sizes", counted)
    run = assemble_run(small_config(tmp_path / "run", dataset_limit=1), ProcessGroups.local())
    assert worlds == [1]  # once, handed to the cost model and to DataCentric's plan
    assert run.dc.pipeline.sp_sizes == real(run.module, 1) == [1]
    # a user's DataCentric computes them itself, or takes the ones it is given
    user = DataCentric(
        build_model("llama"), run.dataset, groups=ProcessGroups.local(), shard="none"
    )
    assert worlds == [1, 1] and user.pipeline.sp_sizes == [1]
    given = DataCentric(
        build_model("llama"), run.dataset, groups=ProcessGroups.local(), shard="none", sp_sizes=(1,)
    )
    assert worlds == [1, 1] and given.pipeline.sp_sizes == [1]


def test_a_run_reads_its_spec_off_the_model_it_built_and_looks_nothing_up_by_name(monkeypatch):
    import datacentric.train.build as build
    from datacentric.models.source import build_model_named
    from datacentric.profiling import factory
    from datacentric.settings.sections import LoraConfig, ModelConfig

    real, built = build.build_from_source, []

    def counted(source, **kwargs):
        built.append(source.name)
        return real(source, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("the run's spec was looked up by name after the build")

    monkeypatch.setattr(build, "build_from_source", counted)
    monkeypatch.setattr(build, "named_spec", refused)
    cpu = torch.device("cpu")
    preset = build.build_run_model(ModelConfig(model="llama"), None, cpu)
    assert preset.bare_spec == get_model_spec("llama")  # an unchanged preset: its config's
    assert preset.mfu is not None and preset.mfu.spec is preset.bare_spec
    name = "tests.user_models:tiny_gpt"
    adapted = build.build_run_model(
        ModelConfig(model=name, model_args=("width=64",)),
        None,
        cpu,
        lora=LoraConfig(rank=2, targets="qkv,out"),
    )
    assert built == ["llama", name]  # each model built once
    bare = build_model_named(name, {"width": 64}, device="meta")
    assert adapted.bare_spec == spec_of_model(bare, name)  # read before the adapters
    assert adapted.bare_spec.trainable_params is None
    assert adapted.module is not None and hasattr(adapted.module, "lora_spec")
    # what the run prices, read once off the model with its adapters, as a name lookup
    # of the built model reads it
    assert preset.spec is preset.bare_spec and adapted.spec is adapted.trained_spec
    assert adapted.spec.trainable_params is not None
    lora = adapted.source.lora
    assert adapted.spec == factory.named_spec(name, {"width": 64}, lora, module=adapted.module)


def test_a_run_fingerprints_its_profile_by_the_model_it_built(monkeypatch):
    """The identity a measured profile's fingerprint records of a model that is not a
    preset is read off the run's model once it is built, before its adapters: the same
    as building it again on the meta device by name, which the run no longer does."""
    import datacentric.models.source as source
    import datacentric.train.build as build
    from datacentric.profiling.store import fingerprint, model_identity
    from datacentric.settings.sections import LoraConfig, ModelConfig

    cpu = torch.device("cpu")
    name, args = "tests.user_models:tiny_gpt", {"width": 64}
    by_name = model_identity(name, args)
    preset = build.build_run_model(ModelConfig(model="llama"), None, cpu)
    assert preset.identity is None and model_identity("llama") is None  # its config instead

    def refused(*args, **kwargs):
        raise AssertionError("the model was built again to fingerprint its profile")

    monkeypatch.setattr(source, "build_model_named", refused)
    adapted = build.build_run_model(
        ModelConfig(model=name, model_args=("width=64",)),
        None,
        cpu,
        lora=LoraConfig(rank=2, targets="qkv,out"),
    )
    assert adapted.identity == by_name  # read before the adapters were injected
    assert adapted.profile_spec is adapted.bare_spec  # what its profile records, read once
    found = fingerprint(name, 1, "float32", "gloo", args, identity=adapted.identity)
    assert found["model_config"] == by_name
    with pytest.raises(ValueError, match="needs its identity"):
        fingerprint(name, 1, "float32", "gloo", args)


def test_a_model_not_built_is_read_by_name_once_and_only_when_asked(monkeypatch):
    """A model the run does not build (a measured comparison's launcher) is built on the
    meta device once, when its profile's fingerprint or spec is first read, and not again
    for the copies placed for each profile: the same identity and spec as found by name."""
    import datacentric.models.source as source
    from datacentric.profiling import factory
    from datacentric.profiling.store import model_identity
    from datacentric.settings.sections import LoraConfig, ModelConfig
    from datacentric.train.build import RunModel, RunPlace

    name, args = "tests.user_models:tiny_gpt", {"width": 64}
    by_name, spec_by_name = model_identity(name, args), factory.named_spec(name, args)
    factory._built_spec.cache_clear()  # nothing read by name before the run's model
    built = []
    real = source.build_from_source

    def counted(found, **kwargs):
        built.append(kwargs.get("device"))
        return real(found, **kwargs)

    monkeypatch.setattr(source, "build_from_source", counted)
    config = ModelConfig(model=name, model_args=("width=64",))
    model = RunModel.of(config, LoraConfig(rank=2, targets="qkv,out"))
    placed = [model.placed(RunPlace(world_size=world)) for world in (1, 2)]
    assert built == []  # nothing read yet: nothing built
    assert [p.identity for p in placed] == [by_name, by_name]
    assert [p.profile_spec for p in placed] == [spec_by_name, spec_by_name]
    assert built == ["meta"]
    preset = RunModel.of(ModelConfig(model="llama")).placed(RunPlace())
    assert preset.identity is None and preset.profile_spec == factory.get_model_spec("llama")
    assert built == ["meta"]  # a preset's config and analytic spec: nothing built


def test_a_model_with_fewer_ids_than_its_data_is_refused_naming_the_data_s_kind():
    """A tokenizer with more ids than the model points at the model's own tokenizer; a
    synthetic workload (no tokenizer: random ids) at text files with that tokenizer."""
    from types import SimpleNamespace

    from datacentric.data.text import SyntheticTextDataset
    from datacentric.shapes import SampleShape
    from datacentric.train.build import _check_vocab

    module = torch.nn.Linear(1, 1)
    module.config = SimpleNamespace(vocab_size=100)
    synthetic = SyntheticTextDataset([SampleShape.text(8)], vocab_size=256)
    with pytest.raises(ValueError, match="synthetic workload draws ids below 256: train on"):
        _check_vocab("tiny", module, None, synthetic)
    tokenized = SimpleNamespace(vocab_size=300)
    with pytest.raises(ValueError, match="tokenizer has 300: use the model's own tokenizer"):
        _check_vocab("tiny", module, None, tokenized)
    _check_vocab("tiny", module, None, SimpleNamespace(vocab_size=100))


def test_the_analytic_cost_model_prices_the_run_s_own_nodes():
    """The cost model kept its preset's node whatever the run's layout: 2 ranks on nodes
    of 1 (torchrun --nproc-per-node 1 on two machines) priced a group of 2 as inside a
    node. The run's place carries its ranks per node (its process groups')."""
    from datacentric.planning.hardware import get_hardware
    from datacentric.settings.sections import CostConfig, ModelConfig
    from datacentric.train.build import RunModel, RunPlace, run_cost_model

    model, cost = RunModel.of(ModelConfig(model="llama")), CostConfig(cost_model="analytic")
    preset = get_hardware("cpu-local").gpus_per_node
    nodes = [
        run_cost_model(model.placed(RunPlace(world_size=2, ranks_per_node=n)), cost)
        for n in (None, 2, 1)
    ]
    assert [m.gpus_per_node for m in nodes] == [preset, min(preset, 2), 1]
    assert ProcessGroups.local().ranks_per_node == 1


def test_a_profiled_run_hands_its_node_to_its_profile(monkeypatch):
    """The profile a run measures or reuses records the run's ranks per node as its
    process groups read them (RunPlace.ranks_per_node): none read again by the profiler."""
    from datacentric.settings.sections import CostConfig, ModelConfig
    from datacentric.train import build

    monkeypatch.setattr(build, "ensure_profile", lambda directory, settings, *a, **k: settings)
    monkeypatch.setattr(build, "fitted_cost_model", lambda settings: settings)
    model, cost = build.RunModel.of(ModelConfig(model="llama")), CostConfig(cost_model="profile")
    found = [
        build.run_cost_model(model.placed(build.RunPlace(world_size=2, ranks_per_node=n)), cost)
        for n in (None, 2, 1)
    ]
    assert [settings.ranks_per_node for settings in found] == [None, 2, 1]
