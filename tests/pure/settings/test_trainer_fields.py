"""The table of transformers' and TRL's fields and methods (settings.trainer_fields):
what the did-you-mean answers, and that every honoured entry names a test that exists.
The installed classes are checked against it in tests/runtime/integrations/test_conformance.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from datacentric.settings import SECTIONS
from datacentric.settings.trainer_fields import (
    DROP_IN_TESTS,
    HONOURED,
    KINDS,
    METHODS,
    TORCHTITAN,
    equivalent,
    fields,
    markdown,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("eval_steps", "validation.every"),
        ("--validation.freq", "validation.every"),
        ("per_device_train_batch_size", "scheduling.global_batch_samples"),
        ("--learning-rate", "training.lr"),
        ("num_train_epochs", "training.epochs"),
        ("max_steps", "training.iterations"),
        ("output_dir", "job.out"),
    ],
)
def test_another_trainers_name_has_our_equivalent(name, ours) -> None:
    assert equivalent(name)[0] == ours


def test_no_equivalent_for_a_name_of_nothing() -> None:
    assert equivalent("dataloader_num_workers") is None  # harmless: no setting of ours
    assert equivalent("no_such_field") is None


def test_every_equivalent_is_one_of_our_settings() -> None:
    ours = {f"{name}.{f.name}" for name, c in SECTIONS.items() for f in dataclasses.fields(c)}
    named = {t.setting for t in [*fields().values(), *METHODS.values()] if t.setting}
    assert named | set(TORCHTITAN.values()) <= ours


def test_every_honoured_entry_names_a_test_that_exists() -> None:
    defined = set()
    for path in (ROOT / DROP_IN_TESTS).glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE))
    entries = {**fields(), **METHODS}
    assert {t.kind for t in entries.values()} <= set(KINDS)
    missing = {
        name: t.test for name, t in entries.items() if t.kind == HONOURED and t.test not in defined
    }
    assert not missing


def test_docs_print_the_table() -> None:
    assert markdown() in (ROOT / "docs/integrations.md").read_text()


def test_a_settings_file_reads_other_trainers_names_from_the_one_table(
    tmp_path, monkeypatch
) -> None:
    from datacentric.settings import ConfigError, load_config, trainer_fields

    def refusal(text: str) -> str:
        path = tmp_path / "run.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as refused:
            load_config(path)
        return str(refused.value)

    # a TrainingArguments field the table maps, a Megatron-LM name, a torchtitan key
    assert "did you mean 'global_batch_samples'" in refusal(
        "[scheduling]\nper_device_train_batch_size = 4\n"
    )
    assert "did you mean 'iterations'" in refusal("[training]\ntrain_iters = 10\n")
    assert "did you mean 'checkpoint_every'" in refusal("[checkpoint]\ninterval = 10\n")
    # a name planted in the table is answered (unplanted: 'betas', the closest spelling)
    planted = {**trainer_fields.OTHER_TRAINERS, "zeta": ("training.lr", "a planted")}
    monkeypatch.setattr(trainer_fields, "OTHER_TRAINERS", planted)
    assert "did you mean 'lr'" in refusal("[training]\nzeta = 0.1\n")
