"""The ``[lora]`` section becomes a ``LoraSpec`` in one place (``models.model_args.lora_of``),
whether it comes from a command's settings, its flags alone or a run's record."""

from __future__ import annotations

import argparse

import pytest

import datacentric.models.model_args as build
from datacentric.cli.flag_groups import lora_of_args
from datacentric.models.lora import LoraError, LoraSpec
from datacentric.settings import TrainConfig
from datacentric.settings.sections import LoraConfig
from datacentric.train.exporting.lora_export import lora_from_settings

SPEC = LoraSpec(4, 8.0, 0.0, ("q_proj", "v_proj"))


def _flags(**given) -> argparse.Namespace:
    values = {"lora_rank": None, "lora_alpha": None, "lora_dropout": None, "lora_targets": None}
    return argparse.Namespace(**{**values, **given})


def test_settings_flags_and_records_go_through_the_one_conversion(monkeypatch):
    seen = []
    real = build.lora_of

    def counted(lora: LoraConfig):
        seen.append(lora)
        return real(lora)

    monkeypatch.setattr(build, "lora_of", counted)
    section = LoraConfig(rank=4, alpha=8.0, targets="q_proj,v_proj")
    with_settings = _flags()
    with_settings.settings = TrainConfig(lora=section)
    assert lora_of_args(with_settings) == SPEC  # a command that read --config
    assert lora_of_args(_flags(lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj")) == SPEC
    lora = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": "q_proj,v_proj"}
    assert lora_from_settings({"model": {"model": "hf:qwen2"}, "lora": lora}) == SPEC
    assert seen == [section] * 3  # each source read into the same section, converted once
    # LoRA off: rank 0, unset flags, or a record of a full fine-tune (no lora keys)
    assert lora_of_args(_flags()) is None
    assert lora_from_settings({"model": {"model": "llama"}}) is None
    assert lora_from_settings({"lora": {"rank": 0, "alpha": None}}) is None


def test_a_bad_rank_from_the_flags_is_named():
    with pytest.raises(LoraError, match="lora.rank -1"):
        lora_of_args(_flags(lora_rank=-1))
