"""A run's settings are one object of sections; the flat form of earlier versions still works."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import tomllib
import warnings

import pytest

from datacentric.settings import SECTIONS, ConfigError, TrainConfig, load_config
from datacentric.settings.layout import flat_index
from datacentric.settings.run_settings import record_sections
from datacentric.settings.sections import LoraConfig, TrainingConfig


def test_train_config_is_a_composition_of_sections_not_their_subclass():
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert fields == list(SECTIONS)
    # its one base is the list of sections (layout.Sections), holding them as fields
    assert [c.__name__ for c in TrainConfig.__mro__[1:]] == ["Sections", "object"]
    assert not set(TrainConfig.__mro__) & set(SECTIONS.values())
    settings = load_config(None, lr=0.01, lora_rank=4, policy="static", seed=3)
    assert isinstance(settings.training, TrainingConfig) and settings.training.lr == 0.01
    assert isinstance(settings.lora, LoraConfig) and settings.lora.rank == 4
    assert settings.scheduling.max_micro_batch_size == 4096
    assert (settings.scheduling.policy, settings.job.seed) == ("static", 3)
    assert settings.section("training") is settings.training


def test_flat_access_works_with_a_deprecation_warning():
    settings = load_config(None, lr=0.01)
    with pytest.warns(DeprecationWarning, match=r"settings\.training\.lr"):
        assert settings.lr == 0.01
    with pytest.warns(DeprecationWarning, match=r"settings\.lora\.rank"):
        settings.lora_rank = 2
    assert settings.lora.rank == 2
    with pytest.warns(DeprecationWarning, match=r"settings\.model\.model"):
        assert settings.model == "llama" and ":" not in settings.model
    with pytest.raises(AttributeError):
        settings.learning_rate  # noqa: B018


def test_flat_keyword_construction_and_replace_still_work():
    with pytest.warns(DeprecationWarning, match="flat settings"):
        settings = TrainConfig(lr=0.5, model="dit", epochs=2)
    assert (settings.training.lr, settings.model.model, settings.training.epochs) == (
        0.5,
        "dit",
        2,
    )
    with pytest.warns(DeprecationWarning):
        other = dataclasses.replace(settings, lr=0.25)
    assert other.training.lr == 0.25 and settings.training.lr == 0.5  # a copy
    assert settings.updated(training={"lr": 0.25}) == other
    with pytest.warns(DeprecationWarning, match=r"settings\.training\.lr"):
        assert settings.updated(lr=0.25) == other  # a flat key, deprecated


def test_config_json_is_sectioned_and_an_earlier_flat_one_loads(tmp_path, capsys):
    settings = load_config(None, lr=0.02, lora_rank=8, dataset_limit=5)
    path = tmp_path / "config.json"
    settings.save(path)
    record = json.loads(path.read_text())
    assert list(record) == list(SECTIONS) and record["lora"]["rank"] == 8  # no flat key
    assert TrainConfig.from_record(record) == settings
    earlier = {key: getattr(getattr(settings, s), n) for key, (s, n) in flat_index().items()}
    again = TrainConfig.from_record(json.loads(json.dumps(earlier)), "run/config.json")
    assert again == settings and again.data.dataset_limit == 5
    note = capsys.readouterr().err
    assert "run/config.json: flat settings keys" in note and "deprecated" in note
    with pytest.raises(ConfigError, match="unknown settings key 'learning_rate'"):
        record_sections({**earlier, "learning_rate": 1.0}, "config.json")
    with pytest.raises(ConfigError, match="unknown key training.learning_rate"):
        TrainConfig.from_record({"training": {"learning_rate": 1.0}})


def test_settings_update_by_section_keeping_an_older_name_with_its_new_one():
    settings = load_config(None, tokens_per_iteration=512)
    moved = settings.updated(scheduling={"tokens_per_iteration": 256}, job={"out": "b"})
    assert (moved.scheduling.global_batch_tokens, moved.job.out) == (256, "b")
    with pytest.raises(ConfigError, match="scheduling.reorder_window must be >= 1"):
        settings.updated(scheduling={"reorder_window": 0})
    with pytest.raises(TypeError, match="no section"):
        settings.updated(sheduling={"policy": "static"})


def test_settings_travel_to_ranks_and_from_json():
    settings = load_config(None, lr=0.03, trace_steps=(2, 3))
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert TrainConfig.from_record(json.loads(json.dumps(settings.to_json()))) == settings
    with pytest.warns(DeprecationWarning, match="flat"):
        assert TrainConfig.from_flat(settings.flat()) == settings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of this reads flat
        settings.to_toml()
        settings.to_json()


def test_flat_access_from_the_package_fails_the_tests():
    # pyproject.toml turns the warning into an error when our own code reads flat
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit(
            "TrainConfig.lr (flat settings) is deprecated; use settings.training.lr",
            DeprecationWarning,
            "trainer.py",
            1,
            module="datacentric.train.trainer",
        )


def test_toml_files_sectioned_and_flat_load_into_the_sections(tmp_path):
    sectioned = tmp_path / "run.toml"
    sectioned.write_text("[lora]\nrank = 4\n[training]\nlr = 0.02\n[cost]\nmemory_gb = 3.0\n")
    flat = tmp_path / "flat.toml"
    flat.write_text("lora_rank = 4\nlr = 0.02\nmemory_gb = 3.0\n")  # the layout of 0.1
    settings = load_config(sectioned)
    assert (settings.lora.rank, settings.training.lr, settings.cost.memory_gb) == (4, 0.02, 3.0)
    assert load_config(flat) == settings
    shown = tmp_path / "shown.toml"
    shown.write_text(settings.to_toml())
    assert "[lora]" in shown.read_text() and "\nrank = 4\n" in shown.read_text()
    assert load_config(shown) == settings
    # strings TOML holds escaped: a multi-line bucket_config, a path with a quote, a
    # backslash, a tab, a control character and non-ASCII letters
    sectioned.write_text("[data]\nbucket_config = '''\n{\"240p\": {\"1\": [1.0, 1]}}\n'''\n")
    odd = load_config(sectioned, out='runs/a "b"\\c\td\x01\x7f ü')
    shown.write_text(odd.to_toml(), encoding="utf-8")
    assert load_config(shown) == odd and odd.data.bucket_config.endswith("}\n")
    with pytest.raises(ConfigError, match="job.out: .* holds bytes that are not UTF-8"):
        load_config(None, out="runs/\udcff")  # argv's byte 0xff: no file could record it


def test_a_section_of_the_wrong_kind_is_refused():
    with pytest.raises(TypeError, match="needs a TrainingConfig"):
        TrainConfig(training={"lr": 0.01})


def test_a_flag_replaces_the_older_name_a_file_writes_beside_its_new_one(tmp_path):
    from datacentric.cli.flags import apply_config_file
    from datacentric.cli.main import build_parser

    shown = tmp_path / "config.toml"  # as a run folder keeps it: both names, one value
    shown.write_text(load_config(None, global_batch_tokens=1000).to_toml())
    older = tmp_path / "older.toml"
    older.write_text("[scheduling]\ntokens_per_iteration = 100\n")
    for path in (shown, older):
        settings = load_config(path, global_batch_tokens=2000).scheduling
        assert (settings.global_batch_tokens, settings.tokens_per_iteration) == (2000, 2000)
    with pytest.raises(ConfigError, match="not both"):  # two values given at once
        load_config(shown, global_batch_tokens=2000, tokens_per_iteration=3000)
    argv = ["schedule", "--config", str(shown), "--global-batch-tokens", "2000", "--world", "2"]
    args = build_parser().parse_args(argv)
    apply_config_file(args)  # the commands beside train read the file so too
    assert args.settings.scheduling.tokens_per_iteration == 2000
    args = build_parser().parse_args(["schedule", "--config", str(older), "--world", "2"])
    apply_config_file(args)  # the older name in a file is the flag's setting
    assert args.global_batch_tokens == 100


def test_one_setting_under_an_older_layout_and_its_own_takes_one_value(tmp_path):
    run = tmp_path / "run.toml"
    for text, places in [
        ("[profiling]\nwarmup = 5\n[cost]\nwarmup = 3\n", "[profiling] warmup = 5 and [cost]"),
        ("[training]\nlr = 0.2\n[train]\nlr = 0.1\n", "[train] lr = 0.1 and [training] lr"),
        ("lora_rank = 4\n[train]\nlora_rank = 8\n", "[train] lora_rank = 8 and top-level"),
    ]:
        run.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(f"run.toml: {places}")):
            load_config(run)  # not whichever came last
    run.write_text("[profiling]\nwarmup = 3\n[cost]\nwarmup = 3\n")
    assert load_config(run).cost.warmup == 3  # the same value twice
    run.write_text("[scheduling]\ntokens_per_iteration = 100\nglobal_batch_tokens = 200\n")
    said = "run.toml: scheduling.global_batch_tokens: 200, and 100 under its older name"
    with pytest.raises(ConfigError, match=said):  # the file named, as for any other key
        load_config(run)


def test_a_seed_no_run_can_draw_from_or_a_toml_file_hold_is_refused():
    with pytest.raises(ConfigError, match="job.seed: must be >= 0, got -1"):
        load_config(None, seed=-1)  # numpy's generators refused it after the ranks began
    with pytest.raises(ConfigError, match="job.seed: 9223372036854775808 is outside the 64-bit"):
        load_config(None, seed=2**63)
    largest = load_config(None, seed=2**63 - 1, max_tokens=2**63 - 1)
    assert tomllib.loads(largest.to_toml())["job"]["seed"] == 2**63 - 1
