"""The ``[validation]`` section: prefixed keys like ``[lora]``'s, in flags, TOML and the
Python API; off by default; settings that cannot work together refused by name."""

from __future__ import annotations

import argparse
import re

import pytest

from datacentric.cli.flags import add_config_flags, config_from_args
from datacentric.settings import ConfigError, TrainConfig, load_config
from datacentric.settings.sections import ValidationConfig, split_fraction


def _parse(*argv: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_config_flags(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_validation_keys_are_prefixed_in_flags_files_and_code(tmp_path):
    assert TrainConfig().validation == ValidationConfig()  # off by default
    assert TrainConfig().validation.dataset is None
    long = _parse("--validation.dataset", "split=0.1", "--validation.every", "2")
    short = _parse("--validation-dataset", "split=0.1", "--validation-every", "2")
    assert long.validation == short.validation == ValidationConfig(dataset="split=0.1", every=2)
    with pytest.raises(SystemExit):
        _parse("--every", "2")  # never a bare key
    path = tmp_path / "run.toml"
    path.write_text('[validation]\ndataset = "jsonl:held.jsonl"\nevery = 5\nlimit = 8\n')
    loaded = load_config(path)
    assert (loaded.validation.dataset, loaded.validation.every, loaded.validation.limit) == (
        "jsonl:held.jsonl",
        5,
        8,
    )
    assert loaded.validation.every == 5
    shown = tmp_path / "shown.toml"
    shown.write_text(loaded.to_toml())
    assert load_config(shown).validation == loaded.validation
    given = TrainConfig(validation=ValidationConfig(dataset="split=0.2", every=1))
    assert given.validation.every == 1


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"validation_dataset": "split=0"}, "split= takes a fraction between 0 and 1"),
        ({"validation_dataset": "split=x"}, "split= takes a fraction between 0 and 1"),
        ({"validation_every": 3}, "validation.every: nothing to validate"),
        ({"validation_limit": 3}, "validation.limit: no held-out samples"),
        ({"keep_best": True}, "checkpoint.keep_best: needs a validation loss"),
        (
            {"validation_dataset": "split=0.1", "validation_every": 5, "iterations": 4},
            "validation.every: 5 is more than the run's 4 steps",
        ),
        ({"validation_every": -1, "validation_dataset": "split=0.1"}, "validation.every"),
    ],
)
def test_validation_settings_that_cannot_work_are_refused_by_name(values, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, **values)


def test_split_fraction():
    assert split_fraction(None) is None and split_fraction("jsonl:a.jsonl") is None
    assert split_fraction("split=0.25") == 0.25


KEEP_BEST = {"keep_best": True, "validation_dataset": "split=0.1"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"validation_every": 1},
            "validation.every 1 validates at steps that checkpoint.checkpoint_every 500 does "
            "not save, so the best of them may have no checkpoint to keep; set "
            "checkpoint.checkpoint_every to 1 (or a divisor of it), or validation.every to a "
            "multiple of 500",
        ),
        ({"validation_every": 3, "checkpoint_every": 2}, "checkpoint_every to 3"),
        ({"validation_every": 2, "checkpoint_every": 0}, "checkpoint_every 0 (by time only)"),
        ({"validation_every": 0}, "validation.every 0 computes no validation loss"),
    ],
)
def test_keep_best_validated_at_steps_that_are_not_saved_is_refused(values, message):
    """A run validated every step under the default checkpoint_every kept only its last
    checkpoint: the best step's (step 1 of 4, loss 4.55 against 23.4) was never saved,
    and nothing said so."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, **KEEP_BEST, **values)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"validation_every": 4, "checkpoint_every": 2},
        {"validation_every": 5, "checkpoint_every": 5},
    ],
)
def test_keep_best_validated_at_saved_steps_is_taken(values):
    loaded = load_config(None, **KEEP_BEST, **values)
    assert loaded.checkpoint.keep_best
